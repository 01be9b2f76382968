# mypy: disallow-untyped-calls=False
"""Bad-input gate: fuzzing every effector RPC, and malformed envelopes into ``RunAgent``.

**The effector.** One real effector (a subprocess serving the gate tools, on SQLite, with its
token, web console and operator MCP endpoint) takes property-based fuzzing of all eleven RPCs
(hypothesis, derandomized so every run is the same, at least 7,000 cases in all):

- random bytes through a generic method handle (identity serializers): bytes that do not
  parse are INVALID_ARGUMENT; bytes that do parse must be answered as the parsed message is;
- random structurally valid messages: intents, reads, lookups, decisions, publications,
  status, listings, trace events, dead letters and activation records, each generated with
  the flaw it carries, if any, hostile values included (times at int64's ends, 2**62 and
  year 10000; JSON nested past the depth limit; U+202E and control characters);
- hostile batches after each RPC's fuzzing (:mod:`tests.semantics.boundary_gate`): a batch of
  good items and one bad item records the good ones and refuses the bad one alone; envelopes
  of 9 MiB and one just under the message cap; activation records of megabytes; forged
  withdrawals; decisions with edited arguments nested 200,000 deep; re-drives of stored
  errors whose envelopes carry impossible times.

A model of the effector's contract (written from the protos and issue 42, not from its code)
predicts each answer: the status code (never INTERNAL or UNKNOWN), and per item what must be
refused and what must be taken. After each batch the health check must say SERVING, and every
console page and the MCP endpoint's read tools must answer without a 500 or a tool error. At
the end the CLI prints what the store holds (``status``, ``pending``, ``failed``, ``show``)
with bidi and control characters as marks, the hostile approvals are denied through MCP, the
whole log must be readable with ``Read`` and delivered by a ``ReadEnvelopes`` pipeline, every
ACCEPTED intent must reach DONE, no intent that was not accepted may have run (the gate tools
record every execution), and none may have run twice. Every failure found is listed at once.

**RunAgent.** A seeded mix of good events and malformed elements (empty key, key mismatch,
no payload, results and approvals for keys with nothing pending, a huge event, values that
are not envelopes at all) runs through ``RunAgent`` on the FnApiRunner: each bad element
becomes one ``.errors`` record with its documented reason, good ones still run, and the
pipeline completes.
"""

from __future__ import annotations

import functools
import itertools
import json
import random
import re
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.message import DecodeError, Message
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import beam_agents._protos as pb
from beam_agents import AgentConfig, Complete
from beam_agents._protos import (
    AgentEnvelope,
    Approval,
    ToolIntent,
    ToolResult,
    canonical_json,
    json_depth_problem,
)
from beam_agents.core.agent import ErrorReason
from beam_agents.core.context import ActivationContext
from beam_agents.io import ReadEnvelopes
from effector.launch import child_environment, free_port
from tests.core.harness import created, run_agent
from tests.pg import PostgresServer
from tests.semantics.boundary_gate import (
    BIG_ENVELOPE_BYTES,
    DEEP,
    EDGE_TIMES,
    EITHER,
    GET_ROUTES,
    HOSTILE_CHARS,
    INT64_MAX,
    INT64_MIN,
    MESSAGE_CAP_BYTES,
    MUST,
    OUT_OF_RANGE_TIMES,
    RAW_MARKS,
    REPO,
    SPOOF,
    VALID,
    VERY_DEEP,
    YEAR_10000_MS,
    BearerToken,
    Expectation,
    Readers,
    counts_of,
    deep_json,
    deep_object,
    delivered_by_pipeline,
    envelope_expectation,
    error_expectation,
    failures_logged,
    intent_time_problem,
    record_expectation,
    trace_expectation,
    walk_the_log,
)
from tests.semantics.gate_tools import Ledger
from tests.semantics.loop import sidecar

SERVICE = "beam_agents.v1.Effector"
MESSAGES: dict[str, tuple[type[Message], type[Message]]] = {
    "Submit": (pb.SubmitRequest, pb.SubmitResponse),
    "Read": (pb.ReadRequest, pb.ReadResponse),
    "GetIntent": (pb.GetIntentRequest, pb.GetIntentResponse),
    "Decide": (pb.DecideRequest, pb.DecideResponse),
    "Publish": (pb.PublishRequest, pb.PublishResponse),
    "Status": (pb.StatusRequest, pb.StatusResponse),
    "ListIntents": (pb.ListIntentsRequest, pb.ListIntentsResponse),
    "RecordTraces": (pb.RecordTracesRequest, pb.RecordTracesResponse),
    "RecordErrors": (pb.RecordErrorsRequest, pb.RecordErrorsResponse),
    "RecordActivations": (pb.RecordActivationsRequest, pb.RecordActivationsResponse),
    "ListRecords": (pb.ListRecordsRequest, pb.ListRecordsResponse),
}
RANDOM_BYTE_CASES = 350
"""Per RPC: 11 x 350 = 3,850 cases of random bytes."""
STRUCTURED_CASES = {
    "Submit": 1_200,
    "Read": 300,
    "GetIntent": 300,
    "Decide": 300,
    "Publish": 300,
    "Status": 1,
    "ListIntents": 300,
    "RecordTraces": 250,
    "RecordErrors": 250,
    "RecordActivations": 200,
    "ListRecords": 200,
}
"""3,601 cases of structurally valid messages (a pb.StatusRequest has no fields: one case)."""
MIN_CASES = 7_000
CALL_TIMEOUT_S = 30.0
APPROVAL_EXPIRY_WAIT_S = 2.5
"""How long after its Submit every short-lived generated approval has expired."""
TOKEN = "bad-input-gate-token-5d2e"

# The contract's limits, as the effector documents them.
MAX_BATCH = 1_000
MAX_TEXT_FIELD_CHARS = 4_096
DEFAULT_READ_BATCH, MAX_READ_BATCH = 500, 5_000
DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT = 100, 1_000
DEFAULT_RECORD_RUNS, MAX_RECORD_RUNS = 100, 1_000
LISTABLE_STATES = {
    pb.IntentState.PENDING,
    pb.IntentState.RUNNING,
    pb.IntentState.AWAITING_DECISION,
    pb.IntentState.DONE,
    pb.IntentState.IN_DOUBT,
}
MAYBE_LISTABLE = {pb.IntentState.WITHDRAWN}
"""A state the protos added with issue 42 without saying whether ListIntents takes it."""
DIGEST = re.compile(r"(?:[0-9a-f]{64})?")
"""An args digest: SHA-256 in lowercase hex, or none."""
CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
FUZZ_SETTINGS = settings(
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)

INVALID = grpc.StatusCode.INVALID_ARGUMENT
OK = grpc.StatusCode.OK
EITHER_FLAW = "either:"
"""A Submit flaw starting with this may be accepted or rejected (the contract does not say)."""


# -- the model of the contract ------------------------------------------------------------


@dataclass
class Model:
    """What the effector has been told so far, as far as the test can know it."""

    recorded: dict[str, bytes] = field(default_factory=dict)
    """Intent id → the first recorded intent's deterministic bytes."""
    accepted_tools: set[str] = field(default_factory=set)
    accepted_approvals: set[str] = field(default_factory=set)
    rejected: set[str] = field(default_factory=set)
    """Ids recorded as REJECTED (a valid id and key, but the intent cannot run)."""
    decided: set[str] = field(default_factory=set)
    published: dict[int, AgentEnvelope] = field(default_factory=dict)
    """Offset → each envelope Publish appended."""
    head: int = 0
    """The highest offset known to be on the log."""
    record_keys: set[bytes] = field(default_factory=set)
    withdrawals: set[str] = field(default_factory=set)
    """Accepted WITHDRAWAL intents: recorded DONE, never executed."""
    withdrawn: set[str] = field(default_factory=set)
    """Approvals a withdrawal named while they awaited a decision: WITHDRAWN for good."""
    hostile_intents: set[str] = field(default_factory=set)
    """Recorded intents holding odd values (edge times, spoofing text, huge arguments)."""
    cases: Counter[str] = field(default_factory=Counter)

    def known_ids(self) -> list[str]:
        return sorted(self.recorded)


def well_identified(intent: ToolIntent) -> bool:
    """A canonical (lowercase, hyphenated) UUID and a non-empty key: the effector records it."""
    return bool(CANONICAL_UUID.fullmatch(intent.intent_id)) and bool(intent.entity_key)


def out_of_bounds(intent: ToolIntent) -> str | None:
    """A value past the wire's bounds (a time, the arguments' depth): the intent is refused."""
    return intent_time_problem(intent) or json_depth_problem("args_json", intent.args_json)


def check_submit(
    model: Model,
    request: pb.SubmitRequest,
    code: grpc.StatusCode,
    response: pb.SubmitResponse | None,
    flaws: list[str | None] | None,
    recorded: Callable[[str], bool],
) -> None:
    """The contract of Submit; ``flaws`` says which intents must be rejected, when known.

    ``recorded(intent_id)`` says whether the effector holds an intent: one it refuses may be
    recorded (REJECTED, published) or, when it cannot be stored as it is, not.
    """
    count = len(request.intents)
    if count == 0 or count > MAX_BATCH:
        assert code == INVALID, (count, code)
        return
    assert code == OK and response is not None, code
    assert len(response.acks) == count
    wrong: list[str] = []
    for position, (intent, ack) in enumerate(zip(request.intents, response.acks, strict=True)):
        flaw = None if flaws is None else flaws[position]
        problem = ack_problem(model, intent, ack, flaw, flaws is not None, recorded)
        if problem is not None:
            wrong.append(f"intent {position}: {problem}; ack {_brief(ack)}")
    assert not wrong, wrong


def ack_problem(
    model: Model,
    intent: ToolIntent,
    ack: pb.SubmitAck,
    flaw: str | None,
    flaws_known: bool,
    recorded: Callable[[str], bool],
) -> str | None:
    """What is wrong with one acknowledgement (the model learns the outcome either way)."""
    if not well_identified(intent):
        if ack.outcome != pb.SubmitAck.REJECTED or not ack.reason:
            return "an intent with a malformed id or an empty key was not refused"
        return None if ack.intent_id == intent.intent_id[:128] else "the ack names another id"
    if ack.intent_id != intent.intent_id:
        return "the ack names another id"
    blob = intent.SerializeToString(deterministic=True)
    first = model.recorded.get(intent.intent_id)
    if first is not None:
        if first == blob:
            return None if ack.outcome == pb.SubmitAck.DUPLICATE else "a duplicate not DUPLICATE"
        if ack.outcome != pb.SubmitAck.REJECTED:
            return "a conflicting resubmission was not refused"
        # Refused as a conflict, or for its own bounds (it could not be stored anyway).
        conflict = "conflict" in ack.reason or out_of_bounds(intent) is not None
        return None if conflict else "a conflicting resubmission was not refused as a conflict"
    bounds = out_of_bounds(intent)
    if ack.outcome == pb.SubmitAck.REJECTED and not recorded(intent.intent_id):
        # Refused unrecorded: only an intent that cannot be stored as it is may be.
        if bounds is None and not (flaw or "").startswith(EITHER_FLAW):
            return "refused unrecorded, though only its tool or arguments are wrong"
        return None if ack.reason else "REJECTED with no reason"
    model.recorded[intent.intent_id] = blob
    if ack.outcome == pb.SubmitAck.REJECTED:
        model.rejected.add(intent.intent_id)
    elif ack.outcome != pb.SubmitAck.ACCEPTED:
        return "a first submission neither ACCEPTED nor REJECTED"
    elif intent.kind == ToolIntent.WITHDRAWAL:
        model.withdrawals.add(intent.intent_id)
    elif intent.kind == ToolIntent.APPROVAL:
        model.accepted_approvals.add(intent.intent_id)
    else:
        model.accepted_tools.add(intent.intent_id)
    if bounds is not None:
        return None if ack.outcome == pb.SubmitAck.REJECTED else f"accepted though {bounds}"
    if ack.outcome == pb.SubmitAck.REJECTED and not ack.reason:
        return "REJECTED with no reason"
    if flaws_known and not (flaw or "").startswith(EITHER_FLAW):
        expected = pb.SubmitAck.ACCEPTED if flaw is None else pb.SubmitAck.REJECTED
        if ack.outcome != expected:
            return f"expected {pb.SubmitAck.Outcome.Name(expected)} (flaw {flaw!r})"
    return None


def check_read(
    model: Model, request: pb.ReadRequest, code: grpc.StatusCode, response: pb.ReadResponse | None
) -> None:
    if min(request.from_offset, request.max_batch, request.wait_ms, request.max_bytes) < 0:
        assert code == INVALID, code
        return
    assert code == OK and response is not None, code
    start = max(request.from_offset, 1)
    offsets = [record.offset for record in response.records]
    assert offsets == list(range(start, start + len(offsets)))
    assert len(offsets) <= min(request.max_batch or DEFAULT_READ_BATCH, MAX_READ_BATCH)
    assert response.next_offset == (offsets[-1] + 1 if offsets else start)
    # Bounded by bytes, and always progress: a record past the bound only when it is the first.
    if request.max_bytes and len(offsets) > 1:
        before_last = sum(record.envelope.ByteSize() for record in response.records[:-1])
        assert before_last < request.max_bytes, (before_last, request.max_bytes)
    if start <= model.head:
        assert offsets, f"Read from {start} answered nothing with the log at {model.head}"
    model.head = max(model.head, *offsets, 0)


def check_get_intent(
    model: Model, request: pb.GetIntentRequest, code: grpc.StatusCode, response: Any
) -> None:
    if not CANONICAL_UUID.fullmatch(request.intent_id):
        assert code == INVALID, code
        return
    assert code == OK and response is not None, code
    first = model.recorded.get(request.intent_id)
    assert response.found == (first is not None)
    if first is not None:
        assert response.intent.SerializeToString(deterministic=True) == first
        if request.intent_id in model.rejected:
            assert response.state == pb.IntentState.DONE
            assert response.result.status == ToolResult.REJECTED


def check_decide(
    model: Model, request: pb.DecideRequest, code: grpc.StatusCode, response: Any
) -> None:
    if (
        not CANONICAL_UUID.fullmatch(request.intent_id)
        or max(len(request.approver), len(request.reason)) > MAX_TEXT_FIELD_CHARS
    ):
        assert code == INVALID, code
        return
    if (request.edited_args_json or not DIGEST.fullmatch(request.args_digest)) and code == INVALID:
        return  # edited arguments and digests are validated: refused, or not applied
    assert code == OK and response is not None, code
    if response.applied:
        # Only an accepted approval, once (it may also have expired first: then not applied).
        assert request.intent_id in model.accepted_approvals, request.intent_id
        assert request.intent_id not in model.decided, "an approval was decided twice"
        assert request.intent_id not in model.withdrawn, "a withdrawn approval was decided"
        assert json_depth_problem("edited_args_json", request.edited_args_json) is None
        model.decided.add(request.intent_id)
    else:
        assert response.reason


def check_publish(
    model: Model, request: pb.PublishRequest, code: grpc.StatusCode, response: Any
) -> None:
    """Per envelope: an out-of-bounds one is refused alone (offset 0 and a problem)."""
    envelopes = request.envelopes
    if not envelopes or len(envelopes) > MAX_BATCH:
        assert code == INVALID, code
        return
    assert code == OK and response is not None, code
    offsets, problems = list(response.offsets), list(response.problems)
    assert len(offsets) == len(envelopes), (len(offsets), len(envelopes))
    assert len(problems) in (0, len(envelopes)), problems
    appended = []
    for position, (envelope, offset) in enumerate(zip(envelopes, offsets, strict=True)):
        problem = problems[position] if problems else ""
        assert (offset == 0) == bool(problem), (position, offset, problem)
        expectation = envelope_expectation(envelope)
        assert expectation != MUST or offset == 0, f"envelope {position} appended at {offset}"
        assert expectation != VALID or offset > 0, f"envelope {position} refused: {problem}"
        if offset:
            appended.append(offset)
            model.published[offset] = envelope
    if appended:
        assert appended == list(range(appended[0], appended[0] + len(appended))), appended
        model.head = max(model.head, appended[-1])


def check_status(model: Model, code: grpc.StatusCode, response: Any) -> None:
    assert code == OK and response is not None, code
    assert response.in_flight == response.pending + response.running + response.awaiting_decision
    assert response.head_offset >= model.head
    model.head = response.head_offset


def check_list(
    model: Model, request: pb.ListIntentsRequest, code: grpc.StatusCode, response: Any
) -> None:
    if request.state in MAYBE_LISTABLE and code == INVALID:
        return
    if (
        request.state not in LISTABLE_STATES | MAYBE_LISTABLE
        or request.limit < 0
        or (request.failed_only and request.state != pb.IntentState.DONE)
    ):
        assert code == INVALID, code
        return
    assert code == OK and response is not None, code
    assert len(response.intents) <= min(request.limit or DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT)
    for intent in response.intents:
        assert intent.intent_id in model.recorded


def check_recorded(
    items: Sequence[Message],
    code: grpc.StatusCode,
    response: Any,
    expectations: Sequence[Expectation],
) -> None:
    """Record*: each valid item taken, each out-of-range one refused, and the counts add up."""
    if not items:
        assert code in (OK, INVALID), code
        return
    if len(items) > MAX_BATCH:
        assert code == INVALID, code
        return
    assert code == OK and response is not None, code
    assert response.recorded + response.duplicates + response.rejected == len(items), response
    assert bool(response.first_problem) == (response.rejected > 0), response
    must = expectations.count(MUST)
    assert response.rejected >= must, f"{must} out-of-range item(s), {response.rejected} refused"
    valid = expectations.count(VALID)
    assert response.rejected <= len(items) - valid, (
        f"{valid} valid item(s) of {len(items)}, {response.rejected} refused: "
        f"{response.first_problem}"
    )


def item_expectations(
    items: Sequence[Message], drawn: Sequence[Expectation] | None
) -> list[Expectation]:
    """What each item must get: MUST from its own values, else what it was drawn as."""
    judge: dict[type[Message], Callable[[Any], Expectation]] = {
        pb.TraceEvent: trace_expectation,
        pb.AgentError: error_expectation,
        pb.ActivationRecord: record_expectation,
    }
    own = [judge[type(item)](item) for item in items]
    if drawn is None:
        return own
    return [MUST if mine == MUST else theirs for mine, theirs in zip(own, drawn, strict=True)]


def check_list_records(
    request: pb.ListRecordsRequest, code: grpc.StatusCode, response: Any
) -> None:
    if not request.entity_key or request.max_runs < 0 or request.before_seq < 0:
        assert code == INVALID, code
        return
    if len(request.entity_key) > 4_096 and code == INVALID:
        return
    assert code == OK and response is not None, code
    places = [(record.seq, record.trace_sequence) for record in response.records]
    assert places == sorted(places), places
    assert {record.entity_key for record in response.records} <= {request.entity_key}
    runs = sorted({seq for seq, _ in places})
    assert len(runs) <= min(request.max_runs or DEFAULT_RECORD_RUNS, MAX_RECORD_RUNS)
    if request.before_seq:
        assert all(seq < request.before_seq for seq in runs), (runs, request.before_seq)
    if response.next_before_seq:
        assert runs and response.next_before_seq == runs[0], (runs, response.next_before_seq)


# -- talking to the server ----------------------------------------------------------------


@dataclass
class Fuzzer:
    """One channel to the server, typed and raw method handles, the model and the readers."""

    channel: grpc.Channel
    readers: Readers
    address: str
    model: Model = field(default_factory=Model)
    failures: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.stub = pb.EffectorStub(self.channel)
        self.raw = {
            name: self.channel.unary_unary(
                f"/{SERVICE}/{name}", request_serializer=None, response_deserializer=None
            )
            for name in MESSAGES
        }

    def call(self, name: str, request: Message) -> tuple[grpc.StatusCode, Any]:
        """Call ``name`` with a typed request: (status code, response or None)."""
        self.model.cases[f"{name}/structured"] += 1
        try:
            return OK, getattr(self.stub, name)(request, timeout=CALL_TIMEOUT_S)
        except grpc.RpcError as error:
            return error.code(), None

    def call_raw(self, name: str, payload: bytes) -> tuple[grpc.StatusCode, Any]:
        """Call ``name`` with raw request bytes: (status code, parsed response or None)."""
        self.model.cases[f"{name}/bytes"] += 1
        try:
            answer = self.raw[name](payload, timeout=CALL_TIMEOUT_S)
        except grpc.RpcError as error:
            return error.code(), None
        return OK, MESSAGES[name][1].FromString(answer)

    def check(
        self,
        name: str,
        request: Message,
        code: grpc.StatusCode,
        response: Any,
        flaws: Sequence[Any] | None = None,
        hostile: bool = False,
    ) -> None:
        """Hold one answer against the model; a failure is kept (all are reported at the end)."""
        try:
            assert code not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), code
            self._check(name, request, code, response, flaws)
        except AssertionError as failure:
            self.fail(f"{name} {code.name} {_brief(request)}: {_brief_text(str(failure))}")
        self._touch(name, request, hostile)

    def fail(self, text: str) -> None:
        self.failures.append(text)

    def _check(
        self,
        name: str,
        request: Any,
        code: grpc.StatusCode,
        response: Any,
        flaws: Sequence[Any] | None,
    ) -> None:
        model = self.model
        if name == "Submit":
            flaw_list = None if flaws is None else list(flaws)
            check_submit(model, request, code, response, flaw_list, self.recorded)
        elif name == "Read":
            check_read(model, request, code, response)
        elif name == "GetIntent":
            check_get_intent(model, request, code, response)
        elif name == "Decide":
            check_decide(model, request, code, response)
        elif name == "Publish":
            check_publish(model, request, code, response)
        elif name == "Status":
            check_status(model, code, response)
        elif name == "ListIntents":
            check_list(model, request, code, response)
        elif name == "ListRecords":
            check_list_records(request, code, response)
        else:
            items = request.events if name == "RecordTraces" else _items(request)
            check_recorded(items, code, response, item_expectations(items, flaws))

    def _touch(self, name: str, request: Any, hostile: bool) -> None:
        """Tell the readers which keys and intents the request may have stored."""
        touched = self.readers.touched
        if name == "Submit":
            for intent in request.intents:
                if intent.intent_id in self.model.recorded:
                    edges = {intent.created_at_ms, intent.expires_at_ms} & set(EDGE_TIMES)
                    hostile_intent = hostile or bool(edges) or _odd(intent.args_json)
                    touched.intent(intent.intent_id, hostile_intent)
                    if hostile_intent:
                        self.model.hostile_intents.add(intent.intent_id)
                    touched.key(intent.entity_key, hostile_intent)
        elif name in ("RecordTraces", "RecordErrors", "RecordActivations"):
            items: Sequence[Any] = request.events if name == "RecordTraces" else _items(request)
            for item in items:
                touched.key(item.entity_key, hostile)
                if name == "RecordActivations":
                    self.model.record_keys.add(item.entity_key)

    def recorded(self, intent_id: str) -> bool:
        """Whether the effector holds ``intent_id`` (asked with GetIntent)."""
        request = pb.GetIntentRequest(intent_id=intent_id)
        return bool(self.stub.GetIntent(request, timeout=CALL_TIMEOUT_S).found)

    def healthy(self) -> bool:
        response = health_pb2_grpc.HealthStub(self.channel).Check(
            health_pb2.HealthCheckRequest(service=SERVICE), timeout=CALL_TIMEOUT_S
        )
        return bool(response.status == health_pb2.HealthCheckResponse.SERVING)

    def after_batch(self, batch: str) -> None:
        """Health SERVING, then every reader over what the store now holds."""
        if not self.healthy():
            self.fail(f"unhealthy after {batch}")
        before = len(self.readers.failures)
        self.readers.sweep(batch)
        self.failures += self.readers.failures[before:]


def _items(request: Any) -> Sequence[Message]:
    items: Sequence[Message] = (
        request.errors if isinstance(request, pb.RecordErrorsRequest) else request.records
    )
    return items


def _odd(text: str) -> bool:
    return len(text) > 10_000 or any(char in HOSTILE_CHARS for char in text)


def _brief_text(text: str, limit: int = 240) -> str:
    text = re.sub(r"\s+", " ", text)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


def _brief(request: Message) -> str:
    """A request in one short line: long strings and bytes cut to their start and length."""

    def cut(value: Any) -> Any:
        if isinstance(value, (str, bytes)) and len(value) > 40:
            return f"{value[:24]!r}...({len(value)})"
        return value

    fields = []
    for descriptor, value in request.ListFields():
        if isinstance(value, Message):
            fields.append(f"{descriptor.name}={{{_brief(value)}}}")
        elif isinstance(value, (str, bytes, int, float)):
            fields.append(f"{descriptor.name}={cut(value)!r}")
        elif hasattr(value, "items"):
            fields.append(f"{descriptor.name}={dict(list(value.items())[:3])!r:.80}")
        else:
            shown = [
                _brief(item) if isinstance(item, Message) else repr(cut(item)) for item in value
            ]
            fields.append(f"{descriptor.name}=[{len(value)}: {', '.join(shown[:3])}]")
    return _brief_text(" ".join(fields), 400)


# -- strategies ---------------------------------------------------------------------------

_FRESH = itertools.count()
IN_RANGE_TIMES = st.one_of(st.integers(pb.MIN_TIME_MS, pb.MAX_TIME_MS), st.sampled_from(EDGE_TIMES))
HOSTILE_TIMES = st.sampled_from(OUT_OF_RANGE_TIMES)


def fresh_id() -> str:
    """A new canonical id, reproducibly (hypothesis alone would repeat simple UUIDs a lot)."""
    return str(uuid.uuid5(uuid.NAMESPACE_OID, f"gate-fuzz-{next(_FRESH)}"))


def fresh_hex(digits: int) -> str:
    """A new lowercase hex id of ``digits`` digits (trace and span ids)."""
    return uuid.uuid5(uuid.NAMESPACE_OID, f"gate-hex-{next(_FRESH)}").hex[:digits]


def hostile_text(max_size: int) -> st.SearchStrategy[str]:
    """Text with bidi overrides and control characters mixed in."""
    return st.text(
        alphabet=st.one_of(st.characters(codec="utf-8"), st.sampled_from(HOSTILE_CHARS)),
        max_size=max_size,
    )


def entity_keys() -> st.SearchStrategy[bytes]:
    return st.one_of(
        st.binary(min_size=1, max_size=24),
        hostile_text(24).filter(bool).map(str.encode),
        st.just(SPOOF.encode()),
    )


def malformed_ids() -> st.SearchStrategy[str]:
    return st.one_of(
        st.text(max_size=80),
        st.uuids().map(lambda u: str(u).upper()),
        st.uuids().map(lambda u: u.hex),
        st.uuids().map(lambda u: "{" + str(u) + "}"),
        st.uuids().map(lambda u: f" {u}"),
    ).filter(lambda text: not CANONICAL_UUID.fullmatch(text))


def good_ids() -> st.SearchStrategy[str]:
    return st.one_of(st.builds(fresh_id), st.uuids().map(str))


def touch_args() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({"note": hostile_text(40)})


def tally_args() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"count": st.integers(-(2**53), 2**53)}, optional={"flag": st.booleans()}
    )


def valid_tool_call() -> st.SearchStrategy[tuple[str, str]]:
    return st.one_of(
        touch_args().map(lambda args: ("touch", canonical_json(args))),
        tally_args().map(lambda args: ("tally", canonical_json(args))),
    )


def invalid_tool_call() -> st.SearchStrategy[tuple[str, str, str]]:
    """A TOOL intent's (flaw, tool name, args_json) that the effector must reject."""
    names = st.text(min_size=1, max_size=30).filter(lambda n: n not in {"touch", "tally"})
    wrong_values = st.one_of(
        st.lists(st.integers(), max_size=3), st.dictionaries(st.text(), st.integers(), max_size=2)
    )
    return st.one_of(
        st.tuples(st.just("unknown_tool"), names, st.just('{"note": "x"}')),
        st.tuples(st.just("read_only_tool"), st.just("peek"), st.just('{"name": "x"}')),
        st.tuples(
            st.just("bad_json"),
            st.sampled_from(["touch", "tally"]),
            st.text(min_size=1).filter(lambda t: not _is_json(t)),
        ),
        st.tuples(
            st.just("not_an_object"),
            st.sampled_from(["touch", "tally"]),
            st.sampled_from(["[]", "3", '"note"', "null", "true"]),
        ),
        st.tuples(st.just("missing_argument"), st.just("touch"), st.just("{}")),
        st.tuples(
            st.just("wrong_type"),
            st.just("tally"),
            st.one_of(
                st.text(min_size=1).filter(lambda t: not t.strip().lstrip("-").isdigit()),
                wrong_values,
            ).map(lambda value: canonical_json({"count": value})),
        ),
        st.tuples(
            st.just("intent_argument"),
            st.just("touch"),
            st.just(canonical_json({"note": "x", "intent": {"intent_id": "forged"}})),
        ),
        st.tuples(
            st.just("too_deep"),
            st.just("touch"),
            st.sampled_from([deep_object(65), deep_object(DEEP)]),
        ),
    )


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return False
    return True


@st.composite
def intents(draw: st.DrawFn) -> tuple[ToolIntent, str | None]:
    """A structurally valid intent and the flaw it carries (``None``: it must be accepted)."""
    flaw: str | None = None
    # An int, not a ToolIntent.Kind: proto3 enums are open, and unknown kinds are drawn too
    # (3 is a WITHDRAWAL, which this one cannot be: it names no intent to withdraw).
    kind: int = draw(st.sampled_from([ToolIntent.TOOL, ToolIntent.TOOL, ToolIntent.APPROVAL]))
    if draw(st.integers(0, 9)) == 0:
        flaw, kind = "bad_kind", draw(st.sampled_from([0, 3, 4, 99]))
    # Times are drawn relative to now, so that what is drawn does not depend on the clock.
    now_ms = int(time.time() * 1000)
    if kind == ToolIntent.APPROVAL:
        # Created now or in the past, with a TTL short enough that most expire (and so reach
        # DONE) within seconds, or long enough to be decided while Decide is fuzzed; the
        # window is anchored at max(created, receipt).
        created = now_ms - draw(st.integers(0, 3_600_000))
        tool_name = draw(hostile_text(20))
        args_json = draw(st.one_of(touch_args().map(canonical_json), st.just("")))
        if flaw is None and draw(st.integers(0, 5)) == 0:
            flaw = "bad_json"
            args_json = draw(st.text(min_size=1).filter(lambda t: not _is_json(t)))
        expires = created + draw(st.one_of(st.integers(1, 2_000), st.integers(60_000, 120_000)))
    else:
        if flaw is None and draw(st.booleans()):
            flaw, tool_name, args_json = draw(invalid_tool_call())
        else:
            tool_name, args_json = draw(valid_tool_call())
        created = draw(st.one_of(st.just(now_ms), IN_RANGE_TIMES))
        expires = draw(
            st.one_of(
                st.just(0),
                st.integers(1, 2**50).map(lambda ttl: min(created + ttl, pb.MAX_TIME_MS)),
                st.just(pb.MAX_TIME_MS),
            )
        )
    if flaw is None and draw(st.integers(0, 9)) == 0:
        flaw = "expiry_before_created"
        expires = created - draw(st.integers(1, 2**40))
        assume(expires != 0)
    if draw(st.integers(0, 11)) == 0:
        # A time no message may carry: created or expiry past years 1-9999 or int64's ends.
        hostile = draw(HOSTILE_TIMES)
        if draw(st.booleans()):
            created = hostile
        else:
            expires = hostile
        flaw = flaw or "time_out_of_range"
    identity = draw(st.integers(0, 9))
    if identity == 0:
        flaw, intent_id, key = "malformed_id", draw(malformed_ids()), draw(st.binary(max_size=8))
    elif identity == 1:
        flaw, intent_id, key = "empty_key", draw(good_ids()), b""
    else:
        intent_id, key = draw(good_ids()), draw(entity_keys())
    intent = ToolIntent(
        intent_id=intent_id,
        entity_key=key,
        seq=draw(st.integers(0, 2**40)),
        step_index=draw(st.integers(0, 1_000)),
        tool_name=tool_name,
        args_json=args_json,
        created_at_ms=created,
        expires_at_ms=expires,
        kind=kind,  # type: ignore[arg-type]  # an open enum: any int is a valid wire value
        trace_id=draw(st.text(max_size=16)),
    )
    return intent, flaw


def envelopes() -> st.SearchStrategy[AgentEnvelope]:
    key = st.one_of(st.just(b""), entity_keys())
    time_ms = st.one_of(st.just(0), IN_RANGE_TIMES, HOSTILE_TIMES)
    return st.one_of(
        st.builds(
            lambda k, t, e: AgentEnvelope(entity_key=k, event_time_ms=t, external_event=e),
            key,
            time_ms,
            st.one_of(st.binary(max_size=64), hostile_text(64).map(str.encode)),
        ),
        st.builds(
            lambda k, t: AgentEnvelope(
                entity_key=k, event_time_ms=t, tool_result=ToolResult(intent_id=fresh_id())
            ),
            key,
            time_ms,
        ),
        st.builds(
            lambda k, t: AgentEnvelope(
                entity_key=k, event_time_ms=t, approval=Approval(intent_id=fresh_id())
            ),
            key,
            time_ms,
        ),
        st.builds(lambda k: AgentEnvelope(entity_key=k), key),
    )


@st.composite
def trace_events(draw: st.DrawFn) -> tuple[pb.TraceEvent, Expectation]:
    """A trace event and what it must get: valid, out of range, or odd (either)."""
    event = pb.TraceEvent(
        trace_id=fresh_hex(32),
        span_id=fresh_hex(16),
        parent_span_id=draw(st.one_of(st.just(""), st.builds(fresh_hex, st.just(16)))),
        entity_key=draw(entity_keys()),
        seq=draw(st.integers(0, 2**40)),
        step_index=draw(st.integers(0, 1_000)),
        event_type=draw(st.integers(1, 7)),  # type: ignore[arg-type]
        attributes=draw(st.dictionaries(hostile_text(16), hostile_text(60), max_size=4)),
        start_ms=draw(IN_RANGE_TIMES),
        end_ms=draw(IN_RANGE_TIMES),
        sequence=draw(st.integers(0, 2**31 - 1)),
        wall_start_unix_nano=draw(st.one_of(st.just(0), st.integers(0, INT64_MAX))),
        wall_end_unix_nano=draw(st.one_of(st.just(0), st.integers(0, INT64_MAX))),
    )
    flaw = draw(st.integers(0, 11))
    expectation: Expectation = VALID
    if flaw == 0:
        setattr(event, draw(st.sampled_from(["start_ms", "end_ms"])), draw(HOSTILE_TIMES))
        expectation = MUST
    elif flaw == 1:
        event.trace_id, expectation = draw(hostile_text(40)), EITHER
    elif flaw == 2:
        event.entity_key, expectation = b"", EITHER
    elif flaw == 3:
        event.attributes["args"] = draw(st.sampled_from([deep_json(65), deep_json(DEEP)]))
        expectation = EITHER
    elif flaw == 4:
        event.event_type, expectation = draw(st.integers(8, 99)), EITHER  # type: ignore[assignment]
    elif flaw == 5:
        event.seq, expectation = -draw(st.integers(1, 2**40)), EITHER
    elif flaw == 6:  # before 1970: a time, but no wall clock's
        event.wall_start_unix_nano, expectation = draw(st.integers(INT64_MIN, -1)), EITHER
    return event, expectation


def embedded_envelopes() -> st.SearchStrategy[tuple[bytes, Expectation]]:
    """An ``AgentError.envelope``: none, an event, garbage, or one with an impossible time."""
    return st.one_of(
        st.just((b"", VALID)),
        st.builds(
            lambda key, t, event: AgentEnvelope(
                entity_key=key, event_time_ms=t, external_event=event
            ).SerializeToString(),
            entity_keys(),
            IN_RANGE_TIMES,
            hostile_text(40).map(str.encode),
        ).map(lambda raw: (raw, VALID)),
        st.binary(min_size=1, max_size=40).map(lambda raw: (raw, EITHER)),
        HOSTILE_TIMES.map(
            lambda t: (
                AgentEnvelope(
                    entity_key=b"redrive-me", event_time_ms=t, external_event=b"e"
                ).SerializeToString(),
                EITHER,
            )
        ),
    )


@st.composite
def agent_errors(draw: st.DrawFn) -> tuple[pb.AgentError, Expectation]:
    envelope, expectation = draw(embedded_envelopes())
    error = pb.AgentError(
        entity_key=draw(entity_keys()),
        reason=draw(st.one_of(st.sampled_from([r.value for r in ErrorReason]), hostile_text(30))),
        detail=draw(hostile_text(200)),
        event_time_ms=draw(IN_RANGE_TIMES),
        envelope=envelope,
        seq=draw(st.integers(0, 2**40)),
        traceback=draw(hostile_text(300)),
        trace_id=draw(st.one_of(st.just(""), st.builds(fresh_hex, st.just(32)))),
    )
    flaw = draw(st.integers(0, 7))
    if flaw == 0:
        error.event_time_ms, expectation = draw(HOSTILE_TIMES), MUST
    elif flaw == 1:
        error.entity_key, expectation = b"", EITHER
    elif flaw == 2:
        error.seq, expectation = -draw(st.integers(1, 2**40)), EITHER
    return error, expectation


RECORD_KEYS = [f"records-{n}".encode() for n in range(6)] + [SPOOF.encode()]


@st.composite
def activation_records(draw: st.DrawFn) -> tuple[pb.ActivationRecord, Expectation]:
    key = draw(st.sampled_from(RECORD_KEYS))
    intent, _ = draw(intents())
    record = pb.ActivationRecord(
        schema_version=1,
        entity_key=key,
        seq=draw(st.integers(0, 40)),
        trigger=draw(st.sampled_from(["event", "tool_result", "approval", SPOOF])),
        envelope=AgentEnvelope(
            entity_key=key, event_time_ms=draw(IN_RANGE_TIMES), external_event=b"e"
        ),
        first_step=draw(st.integers(0, 100)),
        trace_sequence=draw(st.integers(0, 1_000)),
        intents=[intent],
        outcome=draw(st.integers(1, 2)),  # type: ignore[arg-type]
        output=draw(hostile_text(100)).encode(),
    )
    expectation: Expectation = EITHER  # an intent in it may carry any flaw
    flaw = draw(st.integers(0, 7))
    if flaw == 0:
        record.envelope.event_time_ms, expectation = draw(HOSTILE_TIMES), MUST
    elif flaw == 1:
        record.seq = -draw(st.integers(1, 2**40))
    elif flaw == 2:
        record.entity_key = b""
    return record, expectation


# -- hostile batches: one per RPC, after its fuzzing ----------------------------------------


def touch_intent(key: bytes, note: str, **fields: Any) -> ToolIntent:
    """A valid ``touch`` intent (fields override), created now."""
    intent = ToolIntent(
        intent_id=fresh_id(),
        entity_key=key,
        tool_name="touch",
        args_json=canonical_json({"note": note}),
        created_at_ms=int(time.time() * 1000),
        kind=ToolIntent.TOOL,
        trace_id="hostile",
    )
    for name, value in fields.items():
        setattr(intent, name, value)
    return intent


def approval_intent(key: bytes, args: dict[str, Any], **fields: Any) -> ToolIntent:
    """An approval on ``args`` (fields override), created now, with no expiry."""
    fields.setdefault("args_json", canonical_json(args))
    return touch_intent(key, "", kind=ToolIntent.APPROVAL, tool_name="transfer", **fields)


def hostile_submits(fuzzer: Fuzzer) -> None:
    """Five valid intents and one bad one per batch: the five are recorded, the bad one refused."""
    now_ms = int(time.time() * 1000)
    bad: list[tuple[str, ToolIntent]] = [
        ("expires_at_ms=INT64_MAX", touch_intent(b"hostile", "x", expires_at_ms=INT64_MAX)),
        ("expires_at_ms=now+2**62", touch_intent(b"hostile", "x", expires_at_ms=now_ms + 2**62)),
        ("expires_at_ms=year 10000", touch_intent(b"hostile", "x", expires_at_ms=YEAR_10000_MS)),
        ("created_at_ms=2**62", touch_intent(b"hostile", "x", created_at_ms=2**62)),
        ("created_at_ms=INT64_MIN", touch_intent(b"hostile", "x", created_at_ms=INT64_MIN)),
        ("args 1,000 deep", touch_intent(b"hostile", "x", args_json=deep_object(DEEP))),
        ("args 200,000 deep", touch_intent(b"hostile", "x", args_json=deep_object(VERY_DEEP))),
        (
            "approval expiring 2**62 ms ahead",
            approval_intent(b"hostile", {"to": "x"}, expires_at_ms=now_ms + 2**62),
        ),
        (
            "approval args 1,000 deep",
            approval_intent(b"hostile", {}, args_json=deep_object(DEEP)),
        ),
    ]
    for label, intent in bad:
        good = [touch_intent(f"hostile-{n}".encode(), f"{SPOOF} {n}") for n in range(5)]
        request = pb.SubmitRequest(intents=[*good[:3], intent, *good[3:]])
        code, response = fuzzer.call("Submit", request)
        fuzzer.check("Submit", request, code, response, [None] * 3 + [label] + [None] * 2)
    # Valid, however odd: text that spoofs, times at the very edges, windows of millennia.
    odd = [
        approval_intent(SPOOF.encode(), {"to": SPOOF, "memo": HOSTILE_CHARS}),
        approval_intent(b"hostile-approval", {"to": "acct-1"}, expires_at_ms=pb.MAX_TIME_MS),
        approval_intent(
            b"hostile-approval",
            {"to": "acct-2"},
            created_at_ms=pb.MIN_TIME_MS,
            expires_at_ms=pb.MAX_TIME_MS,
        ),
        touch_intent(b"hostile-edges", SPOOF, created_at_ms=pb.MIN_TIME_MS),
        touch_intent(
            b"hostile-edges", "x", created_at_ms=pb.MIN_TIME_MS, expires_at_ms=pb.MAX_TIME_MS
        ),
        touch_intent(b"hostile-edges", "y", created_at_ms=pb.MAX_TIME_MS),
        touch_intent(b"hostile-edges", "z" * 1_000_000),
    ]
    request = pb.SubmitRequest(intents=odd)
    code, response = fuzzer.call("Submit", request)
    flaws: list[str | None] = [None] * (len(odd) - 1) + [f"{EITHER_FLAW} a 1 MB argument"]
    fuzzer.check("Submit", request, code, response, flaws, hostile=True)
    hostile_withdrawals(fuzzer, odd[0], odd[1], odd[2])


def withdrawal(target: ToolIntent, **fields: Any) -> ToolIntent:
    """A run's notice that it no longer waits for ``target`` (fields override)."""
    intent = ToolIntent(
        intent_id=pb.withdrawal_id_for(target.intent_id),
        entity_key=target.entity_key,
        kind=ToolIntent.WITHDRAWAL,
        withdraws_intent_id=target.intent_id,
        args_json=canonical_json({"reason": SPOOF}),
        created_at_ms=int(time.time() * 1000),
        trace_id="hostile",
    )
    for name, value in fields.items():
        setattr(intent, name, value)
    return intent


def hostile_withdrawals(
    fuzzer: Fuzzer, target: ToolIntent, other: ToolIntent, third: ToolIntent
) -> None:
    """Withdrawals that name another key's intent, carry a forged id or nest too deeply are
    refused alone; the valid one withdraws its pending approval, which can then not be decided.
    """
    batch = [
        (touch_intent(b"hostile-w", "a"), None),
        (withdrawal(other, entity_key=b"someone-else"), "withdraws another key's intent"),
        (withdrawal(third, intent_id=fresh_id()), "an id that is not withdrawal_id_for"),
        (withdrawal(third, args_json=deep_object(DEEP)), "a reason nested 1,000 deep"),
        (withdrawal(target), None),
        (touch_intent(b"hostile-w", "b"), None),
    ]
    request = pb.SubmitRequest(intents=[intent for intent, _ in batch])
    code, response = fuzzer.call("Submit", request)
    fuzzer.check("Submit", request, code, response, [f for _, f in batch], hostile=True)
    for intent_id, state in (
        (target.intent_id, pb.IntentState.WITHDRAWN),
        (other.intent_id, pb.IntentState.AWAITING_DECISION),
        (third.intent_id, pb.IntentState.AWAITING_DECISION),
    ):
        found = fuzzer.stub.GetIntent(pb.GetIntentRequest(intent_id=intent_id), timeout=10)
        if found.state != state:
            fuzzer.fail(
                f"after hostile withdrawals: approval {intent_id} is "
                f"{pb.IntentState.Name(found.state)}, not {pb.IntentState.Name(state)}"
            )
    fuzzer.model.withdrawn.add(target.intent_id)
    notice = pb.withdrawal_id_for(target.intent_id)
    fuzzer.model.hostile_intents.update({target.intent_id} | {notice} & set(fuzzer.model.recorded))


def hostile_decisions(fuzzer: Fuzzer) -> None:
    """Edited arguments nested past the limit, and spoofing text, on pending approvals; a
    decision on a withdrawn approval, refused with a reason that says so."""
    for intent_id in sorted(fuzzer.model.withdrawn):
        request = pb.DecideRequest(intent_id=intent_id, approved=True, approver=SPOOF)
        code, response = fuzzer.call("Decide", request)
        fuzzer.check("Decide", request, code, response)
        if response is not None and "withdrawn" not in response.reason.lower():
            fuzzer.fail(f"Decide of withdrawn {intent_id}: the reason {response.reason!r}")
    pending = sorted(fuzzer.model.accepted_approvals - fuzzer.model.decided)[:4]
    for intent_id in pending:
        for edited in (deep_object(DEEP), deep_object(VERY_DEEP)):
            request = pb.DecideRequest(
                intent_id=intent_id,
                approved=True,
                approver=SPOOF,
                reason=HOSTILE_CHARS,
                edited_args_json=edited,
            )
            code, response = fuzzer.call("Decide", request)
            fuzzer.check("Decide", request, code, response)


def hostile_publishes(fuzzer: Fuzzer) -> None:
    """Impossible times refused alone; envelopes of 9 MiB and one near the message cap."""
    good = [AgentEnvelope(entity_key=b"pub", external_event=f"good-{n}".encode()) for n in range(3)]
    mixed = [
        good[0],
        *(
            AgentEnvelope(entity_key=b"pub", event_time_ms=t, external_event=b"bad")
            for t in OUT_OF_RANGE_TIMES
        ),
        good[1],
        AgentEnvelope(entity_key=b"pub", event_time_ms=pb.MIN_TIME_MS, external_event=b"year 1"),
        AgentEnvelope(entity_key=b"pub", event_time_ms=pb.MAX_TIME_MS, external_event=b"9999"),
        AgentEnvelope(entity_key=SPOOF.encode(), external_event=SPOOF.encode()),
        AgentEnvelope(entity_key=b"pub", event_time_ms=2**62),  # no payload either
        good[2],
    ]
    request = pb.PublishRequest(envelopes=mixed)
    code, response = fuzzer.call("Publish", request)
    fuzzer.check("Publish", request, code, response)
    # Two envelopes that a Read answer cannot carry together, published one at a time; and
    # one whose request just fits the message cap, which no Read answer can carry at all.
    big = [
        AgentEnvelope(entity_key=b"big", external_event=bytes([n]) * BIG_ENVELOPE_BYTES)
        for n in (1, 2)
    ]
    near_cap = AgentEnvelope(
        entity_key=b"big", external_event=b"\x03" * (MESSAGE_CAP_BYTES - 64 * 1024)
    )
    for envelope in (*big, near_cap):
        request = pb.PublishRequest(envelopes=[envelope])
        code, response = fuzzer.call("Publish", request)
        fuzzer.check("Publish", request, code, response)
    read_all_of_the_log(fuzzer, "hostile Publish")


def read_all_of_the_log(fuzzer: Fuzzer, batch: str) -> None:
    """The whole log, read with the server's default bounds: every answer arrives and advances."""
    head = fuzzer.stub.Status(pb.StatusRequest(), timeout=CALL_TIMEOUT_S).head_offset
    failures: list[str] = []
    walk_the_log(fuzzer.stub, head, failures)
    fuzzer.failures += [f"after {batch}: {failure}" for failure in failures]


def hostile_reads(fuzzer: Fuzzer) -> None:
    """Reads at the byte bound's edges (one byte, the largest int32)."""
    for max_bytes in (1, 2**31 - 1):
        request = pb.ReadRequest(from_offset=1, max_batch=MAX_READ_BATCH, max_bytes=max_bytes)
        code, response = fuzzer.call("Read", request)
        fuzzer.check("Read", request, code, response)


def hostile_span(
    trace_id: str, key: bytes, expectation: Expectation, **fields: Any
) -> tuple[pb.TraceEvent, Expectation]:
    """A span of run 7 of ``key`` with spoofing attributes (``fields`` override or add)."""
    event = pb.TraceEvent(
        trace_id=trace_id,
        span_id=fresh_hex(16),
        entity_key=key,
        seq=7,
        event_type=pb.TraceEvent.TOOL_CALL,
        start_ms=1_767_225_600_000,
        end_ms=1_767_225_601_000,
        attributes={"note": SPOOF, HOSTILE_CHARS: HOSTILE_CHARS},
    )
    for name, value in fields.items():
        if name == "attributes":
            event.attributes.update(value)
        else:
            setattr(event, name, value)
    return event, expectation


def hostile_traces(fuzzer: Fuzzer) -> None:
    """One run of hostile spans on two keys, with valid spans around the impossible ones."""
    for key in (b"hostile-traces", SPOOF.encode()):
        span = functools.partial(hostile_span, fresh_hex(32), key)
        spans = [
            span(VALID, event_type=pb.TraceEvent.ACTIVATION_START, sequence=0),
            span(MUST, start_ms=INT64_MIN),
            span(MUST, end_ms=INT64_MAX),
            span(MUST, start_ms=2**62, end_ms=2**62),
            span(MUST, start_ms=-(2**63), end_ms=YEAR_10000_MS),
            span(VALID, start_ms=pb.MIN_TIME_MS, end_ms=pb.MAX_TIME_MS),
            span(VALID, wall_start_unix_nano=1, wall_end_unix_nano=INT64_MAX),
            span(EITHER, wall_start_unix_nano=INT64_MIN, wall_end_unix_nano=INT64_MAX),
            span(EITHER, attributes={"args": deep_json(DEEP)}),
            span(EITHER, attributes={"args": deep_json(VERY_DEEP)}),
            span(EITHER, attributes={"output": "x" * (3 * 1024 * 1024)}),
            span(EITHER, event_type=99),
            span(VALID, event_type=pb.TraceEvent.ACTIVATION_END, sequence=99),
        ]
        request = pb.RecordTracesRequest(events=[event for event, _ in spans])
        code, response = fuzzer.call("RecordTraces", request)
        fuzzer.check("RecordTraces", request, code, response, [e for _, e in spans], hostile=True)


def hostile_errors(fuzzer: Fuzzer) -> None:
    """Dead letters with impossible times, envelopes that must not be re-driven, huge text."""
    key = b"hostile-errors"

    def error(expectation: Expectation, **fields: Any) -> tuple[pb.AgentError, Expectation]:
        record = pb.AgentError(
            entity_key=key,
            reason="activation_error",
            detail=SPOOF,
            event_time_ms=1_767_225_600_000,
            seq=3,
            traceback=HOSTILE_CHARS,
            trace_id=fresh_hex(32),
        )
        for name, value in fields.items():
            setattr(record, name, value)
        return record, expectation

    def enveloped(time_ms: int) -> bytes:
        return AgentEnvelope(
            entity_key=key, event_time_ms=time_ms, external_event=SPOOF.encode()
        ).SerializeToString()

    errors = [
        error(VALID, seq=1),
        error(MUST, seq=2, event_time_ms=INT64_MAX),
        error(MUST, seq=3, event_time_ms=INT64_MIN),
        error(MUST, seq=4, event_time_ms=2**62),
        error(VALID, seq=5, event_time_ms=pb.MIN_TIME_MS, envelope=enveloped(pb.MIN_TIME_MS)),
        error(VALID, seq=6, event_time_ms=pb.MAX_TIME_MS, envelope=enveloped(pb.MAX_TIME_MS)),
        error(EITHER, seq=7, envelope=enveloped(2**62)),
        error(EITHER, seq=8, envelope=enveloped(INT64_MIN)),
        error(EITHER, seq=9, envelope=b"\xff\x00 not an envelope"),
        error(EITHER, seq=10, traceback="frame\n" * 500_000, detail=deep_json(VERY_DEEP)),
        error(VALID, seq=11, reason=SPOOF),
    ]
    request = pb.RecordErrorsRequest(errors=[e for e, _ in errors])
    code, response = fuzzer.call("RecordErrors", request)
    fuzzer.check("RecordErrors", request, code, response, [e for _, e in errors], hostile=True)
    # Re-driving publishes an envelope the errors hold: the log's own bounds apply to it too
    # (the final ReadEnvelopes pipeline reads whatever it appended).
    before = len(fuzzer.readers.failures)
    fuzzer.readers.redrive_errors("hostile RecordErrors")
    fuzzer.failures += fuzzer.readers.failures[before:]


BIG_RECORD_BYTES = 6 * 1024 * 1024


def hostile_records(fuzzer: Fuzzer) -> None:
    """Records of megabytes on one key (ListRecords must page them), impossible times."""
    key = b"hostile-records"

    def record(seq: int, output: bytes, time_ms: int = 1_767_225_600_000) -> pb.ActivationRecord:
        return pb.ActivationRecord(
            schema_version=1,
            entity_key=key,
            seq=seq,
            trigger="event",
            envelope=AgentEnvelope(entity_key=key, event_time_ms=time_ms, external_event=b"e"),
            outcome=pb.ActivationRecord.COMPLETE,
            output=output,
        )

    batches: list[list[tuple[pb.ActivationRecord, Expectation]]] = [
        [(record(seq, bytes([seq]) * BIG_RECORD_BYTES), EITHER)] for seq in (1, 2, 3)
    ]
    batches.append(
        [
            (record(4, SPOOF.encode()), VALID),
            (record(5, b"x", INT64_MAX), MUST),
            (record(6, b"x", -(2**62)), MUST),
            (record(7, b"x", pb.MIN_TIME_MS), VALID),
        ]
    )
    for batch in batches:
        request = pb.RecordActivationsRequest(records=[r for r, _ in batch])
        code, response = fuzzer.call("RecordActivations", request)
        fuzzer.check("RecordActivations", request, code, response, [e for _, e in batch], True)
    walk_records(fuzzer, key)


def walk_records(fuzzer: Fuzzer, key: bytes) -> None:
    """Every page of ``key``'s records, newest first: each answers, and each makes progress."""
    before, pages = 0, 0
    while True:
        pages += 1
        request = pb.ListRecordsRequest(entity_key=key, before_seq=before)
        code, response = fuzzer.call("ListRecords", request)
        fuzzer.check("ListRecords", request, code, response)
        if response is None or not response.next_before_seq or pages > 10:
            break
        if not response.records:
            fuzzer.fail(f"ListRecords {key!r} before_seq={before}: an empty page with a next one")
            break
        before = response.next_before_seq


def hostile_list_records(fuzzer: Fuzzer) -> None:
    for key in sorted(fuzzer.model.record_keys):
        if key:
            walk_records(fuzzer, key)


HOSTILE: dict[str, Callable[[Fuzzer], None]] = {
    "Submit": hostile_submits,
    "Read": hostile_reads,
    "Decide": hostile_decisions,
    "Publish": hostile_publishes,
    "RecordTraces": hostile_traces,
    "RecordErrors": hostile_errors,
    "RecordActivations": hostile_records,
    "ListRecords": hostile_list_records,
}


# -- the effector fuzzing gate ------------------------------------------------------------


_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", MESSAGE_CAP_BYTES),
    ("grpc.max_send_message_length", MESSAGE_CAP_BYTES),
]


@contextmanager
def fuzzer_on(store: str, tmp_path: Path, ledger: Path) -> Iterator[Fuzzer]:
    """A :class:`Fuzzer` on an effector subprocess over ``store``, with its token, console
    and MCP endpoint; the effector's tracebacks are printed when it stops."""
    token_file = tmp_path / "token"
    token_file.write_text(f"{TOKEN}\n")
    mcp_port = free_port()
    endpoints: tuple[str, ...] = ("--console-listen", f"127.0.0.1:{free_port()}")
    endpoints += ("--mcp-listen", f"127.0.0.1:{mcp_port}", "--token-file", str(token_file))
    with sidecar(store, free_port(), ledger, *endpoints) as effector:
        assert effector.console_url is not None
        readers = Readers(effector.console_url, f"http://127.0.0.1:{mcp_port}/mcp", TOKEN)
        with grpc.insecure_channel(effector.address, options=_CHANNEL_OPTIONS) as plain:
            channel = grpc.intercept_channel(plain, BearerToken(TOKEN))
            try:
                yield Fuzzer(channel, readers, effector.address)
            finally:
                readers.close()
    # What the effector logged (shown when the gate fails): its tracebacks say where it broke.
    for log in effector.logs:
        print("\n".join(failures_logged(log)))


@pytest.fixture
def fuzzer(tmp_path: Path, ledger: Path) -> Iterator[Fuzzer]:
    with fuzzer_on(f"sqlite:///{tmp_path / 'effector.db'}", tmp_path, ledger) as on_sqlite:
        yield on_sqlite


def fuzz_random_bytes(fuzzer: Fuzzer, name: str) -> None:
    request_type = MESSAGES[name][0]

    @settings(FUZZ_SETTINGS, max_examples=RANDOM_BYTE_CASES)
    @given(payload=st.binary(max_size=300))
    def case(payload: bytes) -> None:
        try:
            parsed = request_type.FromString(payload)
        except DecodeError:
            parsed = None
        # A Read that would long-poll past the end of the log only measures patience.
        assume(not (isinstance(parsed, pb.ReadRequest) and parsed.wait_ms > 0))
        code, response = fuzzer.call_raw(name, payload)
        if parsed is None:
            if code != INVALID:
                fuzzer.fail(f"{name} random bytes {payload!r:.120} that do not parse -> {code}")
        else:
            fuzzer.check(name, parsed, code, response)

    case()


def pick(ids: list[str], index: int) -> str:
    """The ``index``-th id (wrapping around), or a fresh one if there are none yet."""
    return ids[index % len(ids)] if ids else fresh_id()


Drawn = tuple[Message, Sequence[Any] | None]


def _batch(items: list[tuple[Any, Any]]) -> tuple[list[Any], list[Any]]:
    return [item for item, _ in items], [expectation for _, expectation in items]


def fuzz_structured(fuzzer: Fuzzer, name: str) -> None:
    model = fuzzer.model
    # An index drawn, then taken into the ids known when the case runs: what is drawn must
    # not depend on state outside the strategy.
    known = st.integers(0, 2**16).map(lambda n: pick(model.known_ids(), n))
    approvals = st.integers(0, 2**16).map(lambda n: pick(sorted(model.accepted_approvals), n))
    any_id = st.one_of(known, approvals, good_ids(), malformed_ids())
    texts = st.one_of(hostile_text(30), st.just("x" * (MAX_TEXT_FIELD_CHARS + 1)))
    edited = st.one_of(
        st.just(""),
        st.just(""),
        touch_args().map(canonical_json),
        st.sampled_from([deep_object(65), deep_object(DEEP), "{", SPOOF]),
    )
    record_keys = st.one_of(
        st.sampled_from(RECORD_KEYS), st.just(b""), entity_keys(), st.just(b"k" * 5_000)
    )
    requests: dict[str, st.SearchStrategy[Drawn]] = {
        "Submit": st.one_of(
            st.lists(intents(), min_size=1, max_size=5),
            st.just([]),
        ).map(
            lambda batch: (
                pb.SubmitRequest(
                    intents=[i for i, _ in batch], redeliver_results=bool(len(batch) % 2)
                ),
                [flaw for _, flaw in batch],
            )
        ),
        "Read": st.builds(
            pb.ReadRequest,
            from_offset=st.integers(-3, 400),
            max_batch=st.integers(-2, 6_000),
            wait_ms=st.integers(-1, 30),
            max_bytes=st.one_of(st.just(0), st.integers(-2, 2**31 - 1), st.integers(1, 400)),
        ).map(lambda r: (r, None)),
        "GetIntent": st.builds(pb.GetIntentRequest, intent_id=any_id).map(lambda r: (r, None)),
        "Decide": st.builds(
            pb.DecideRequest,
            intent_id=any_id,
            approved=st.booleans(),
            approver=texts,
            reason=texts,
            args_digest=st.one_of(st.just(""), st.just(""), hostile_text(64)),
            edited_args_json=edited,
        ).map(lambda r: (r, None)),
        "Publish": st.one_of(
            st.lists(envelopes(), max_size=6),
            st.integers(1, 3).map(
                lambda n: [AgentEnvelope(entity_key=b"k", external_event=b"e")] * (MAX_BATCH + n)
            ),
        ).map(lambda batch: (pb.PublishRequest(envelopes=batch), None)),
        "Status": st.just((pb.StatusRequest(), None)),
        "ListIntents": st.builds(
            pb.ListIntentsRequest,
            state=st.integers(-1, 7),
            limit=st.integers(-3, 2_000),
            failed_only=st.booleans(),
        ).map(lambda r: (r, None)),
        "RecordTraces": st.lists(trace_events(), max_size=6).map(
            lambda batch: (pb.RecordTracesRequest(events=_batch(batch)[0]), _batch(batch)[1])
        ),
        "RecordErrors": st.lists(agent_errors(), max_size=6).map(
            lambda batch: (pb.RecordErrorsRequest(errors=_batch(batch)[0]), _batch(batch)[1])
        ),
        "RecordActivations": st.lists(activation_records(), max_size=4).map(
            lambda batch: (
                pb.RecordActivationsRequest(records=_batch(batch)[0]),
                _batch(batch)[1],
            )
        ),
        "ListRecords": st.builds(
            pb.ListRecordsRequest,
            entity_key=record_keys,
            max_runs=st.integers(-2, 2_000),
            before_seq=st.one_of(st.just(0), st.integers(-2, 50), st.integers(0, 2**62)),
        ).map(lambda r: (r, None)),
    }

    @settings(FUZZ_SETTINGS, max_examples=STRUCTURED_CASES[name])
    @given(drawn=requests[name])
    def case(drawn: Drawn) -> None:
        request, flaws = drawn
        code, response = fuzzer.call(name, request)
        fuzzer.check(name, request, code, response, flaws)

    case()


CLI_SHOWS = 12
"""How many hostile intents ``show`` prints (each is one CLI process)."""


def check_the_cli(fuzzer: Fuzzer) -> int:
    """``status``, ``pending``, ``failed`` and ``show`` over what the store holds; runs made.

    Each must answer (exit 0) without a traceback, printing bidi and control characters as
    visible marks.
    """
    environment = child_environment(REPO, BEAM_AGENTS_EFFECTOR_TOKEN=TOKEN)
    target = ("--target", fuzzer.address)
    commands = [["status"], ["pending", "--limit", "1000"], ["failed", "--limit", "1000"]]
    commands += [["show", i] for i in sorted(fuzzer.model.hostile_intents)[:CLI_SHOWS]]
    for command in commands:
        finished = subprocess.run(
            [sys.executable, "-m", "effector", *command, *target],
            capture_output=True,
            text=True,
            env=environment,
            timeout=60,
        )
        shown = f"beam-agents-effector {' '.join(command)}"
        raw = RAW_MARKS.search(finished.stdout)
        if finished.returncode != 0 or "Traceback" in finished.stderr:
            tail = _brief_text(finished.stderr.strip()[-300:])
            fuzzer.fail(f"{shown} exited {finished.returncode}: {tail}")
        elif raw is not None:
            fuzzer.fail(f"{shown} printed a raw {raw.group()!r}")
    return len(commands)


def decide_the_rest(fuzzer: Fuzzer) -> int:
    """Deny every approval still awaiting a decision; how many there were.

    The generated approvals expire within seconds, but one that arrived as random bytes (or a
    hostile one) may not expire for millennia: like any approval, it waits for a human.
    """
    awaiting = fuzzer.stub.ListIntents(
        pb.ListIntentsRequest(state=pb.IntentState.AWAITING_DECISION, limit=MAX_LIST_LIMIT),
        timeout=CALL_TIMEOUT_S,
    ).intents
    for intent in awaiting:
        fuzzer.stub.Decide(
            pb.DecideRequest(intent_id=intent.intent_id, approved=False, approver="gate"),
            timeout=CALL_TIMEOUT_S,
        )
    return len(awaiting)


def wait_until_all_done(fuzzer: Fuzzer, timeout_s: float = 60) -> dict[str, pb.GetIntentResponse]:
    """Every accepted intent, once DONE."""
    waiting = fuzzer.model.accepted_tools | fuzzer.model.accepted_approvals
    done: dict[str, pb.GetIntentResponse] = {}
    deadline = time.monotonic() + timeout_s
    while waiting:
        for intent_id in sorted(waiting):
            record = fuzzer.stub.GetIntent(
                pb.GetIntentRequest(intent_id=intent_id), timeout=CALL_TIMEOUT_S
            )
            if not record.found:
                fuzzer.fail(f"accepted intent {intent_id} was lost")
                waiting.discard(intent_id)
            elif record.state == pb.IntentState.DONE:
                done[intent_id] = record
                waiting.discard(intent_id)
            elif intent_id in fuzzer.model.withdrawn:
                if record.state != pb.IntentState.WITHDRAWN:
                    fuzzer.fail(f"withdrawn approval {intent_id} is {record.state}")
                waiting.discard(intent_id)
        if waiting and time.monotonic() > deadline:
            fuzzer.fail(f"{len(waiting)} accepted intent(s) never finished: {sorted(waiting)[:3]}")
            return done
        time.sleep(0.2 if waiting else 0)
    return done


def check_delivery(fuzzer: Fuzzer, scratch: Path) -> int:
    """A ``ReadEnvelopes`` pipeline over the fuzzed log delivers every envelope on it."""
    head = fuzzer.stub.Status(pb.StatusRequest(), timeout=CALL_TIMEOUT_S).head_offset
    try:
        delivered = delivered_by_pipeline(fuzzer.address, TOKEN, scratch)
    except Exception as error:  # the pipeline failing is the finding, whatever it raised
        fuzzer.fail(f"ReadEnvelopes over the fuzzed log (head {head}) failed: {error!r:.400}")
        return 0
    if len(delivered) != head:
        fuzzer.fail(f"ReadEnvelopes delivered {len(delivered)} envelopes of {head} on the log")
    have = counts_of(delivered)
    missing = {
        entry: count
        for entry, count in counts_of(fuzzer.model.published.values()).items()
        if have.get(entry, 0) < count
    }
    if missing:
        fuzzer.fail(
            f"ReadEnvelopes missed {len(missing)} accepted envelope(s) of "
            f"{len(fuzzer.model.published)}, e.g. {sorted(missing)[:3]!r:.300}"
        )
    return len(delivered)


def test_fuzzing_every_effector_rpc(
    fuzzer: Fuzzer, ledger: Path, tmp_path: Path, gate_report: Callable[[str, str], None]
) -> None:
    started = time.monotonic()
    last_submit = started
    for name in MESSAGES:
        fuzz_random_bytes(fuzzer, name)
        fuzzer.after_batch(f"random bytes to {name}")
        fuzz_structured(fuzzer, name)
        if name in HOSTILE:
            HOSTILE[name](fuzzer)
        fuzzer.after_batch(f"structured {name} requests")
        if name == "Submit":  # only Submit brings intents: none arrives after this
            last_submit = time.monotonic()
    model = fuzzer.model
    cases = sum(model.cases.values())
    assert cases >= MIN_CASES, model.cases

    # The longest approval TTL generated (2 s, from receipt at the latest) and a margin, counted
    # from the last Submit, so that those have expired (the later RPCs' fuzzing takes longer).
    time.sleep(max(0.0, last_submit + APPROVAL_EXPIRY_WAIT_S - time.monotonic()))
    figures = finish(fuzzer, ledger, tmp_path)
    random_bytes = sum(n for kind, n in model.cases.items() if kind.endswith("/bytes"))
    gate_report(
        "bad-input",
        f"effector: cases={cases} (random_bytes={random_bytes} "
        f"structured={cases - random_bytes}) over {len(MESSAGES)} rpcs, healthy after each of "
        f"{2 * len(MESSAGES)} batches, {figures} in {time.monotonic() - started:.0f}s",
    )


def test_the_hostile_batches_on_postgresql(
    postgres: PostgresServer, ledger: Path, tmp_path: Path, gate_report: Callable[[str, str], None]
) -> None:
    """The hostile batches alone, on PostgreSQL: its integers overflow where SQLite's do not."""
    started = time.monotonic()
    store = postgres.create_database("bad_input")
    with fuzzer_on(store, tmp_path, ledger) as fuzzer:
        for name, hostile in HOSTILE.items():
            hostile(fuzzer)
            fuzzer.after_batch(f"hostile {name} requests")
        figures = finish(fuzzer, ledger, tmp_path)
    gate_report(
        "bad-input",
        f"postgresql: hostile batches of {len(HOSTILE)} rpcs, {figures} "
        f"in {time.monotonic() - started:.0f}s",
    )


def finish(fuzzer: Fuzzer, ledger: Path, scratch: Path) -> str:
    """The end of a gate run: the CLI, the last decisions (hostile ones by MCP), every intent
    done, the whole log read and delivered, the ledger checked; all failures asserted at once.

    Returns the run's figures for the gate's report line.
    """
    model = fuzzer.model
    cli_runs = check_the_cli(fuzzer)
    # The approvals holding hostile values are denied through the MCP endpoint, the rest by gRPC.
    pending = {
        intent.intent_id
        for intent in fuzzer.stub.ListIntents(
            pb.ListIntentsRequest(state=pb.IntentState.AWAITING_DECISION, limit=MAX_LIST_LIMIT),
            timeout=CALL_TIMEOUT_S,
        ).intents
    }
    before = len(fuzzer.readers.failures)
    fuzzer.readers.deny_by_mcp(sorted(pending & model.hostile_intents))
    fuzzer.failures += fuzzer.readers.failures[before:]
    decided_by_hand = decide_the_rest(fuzzer)
    done = wait_until_all_done(fuzzer)
    fuzzer.after_batch("the last decisions")
    read_all_of_the_log(fuzzer, "the fuzzing")
    delivered = check_delivery(fuzzer, scratch)
    statuses = Counter(ToolResult.Status.Name(record.result.status) for record in done.values())
    executions = Ledger.read(ledger).invocation_counts()
    # Nothing ran that was not accepted, nothing ran twice, every accepted tool intent that
    # finished OK ran exactly once, and no approval ran at all.
    ran_ok = {
        i for i in model.accepted_tools if i in done and done[i].result.status == ToolResult.OK
    }
    finished = Counter(
        ToolResult.Status.Name(done[i].result.status) for i in model.accepted_tools if i in done
    )
    for broken, text in (
        (set(executions) - model.accepted_tools, "ran though not accepted"),
        ({i for i, n in executions.items() if n > 1}, "ran more than once"),
        (set(executions) ^ ran_ok, "ran without an OK result, or OK without running"),
        (set(finished) - {"OK", "EXPIRED"}, "accepted tool intents ended neither OK nor EXPIRED"),
    ):
        if broken:
            fuzzer.fail(f"{len(broken)} intent(s) {text}: {sorted(broken)[:3]}")
    if not fuzzer.healthy():
        fuzzer.fail("unhealthy at the end")
    if fuzzer.readers.unreached():
        fuzzer.fail(f"no sweep reached the console's {fuzzer.readers.unreached()}")
    failures = Counter(re.sub(r"[0-9a-f-]{36}", "<id>", failure) for failure in fuzzer.failures)
    listed = "\n".join(
        f"{count} x {failure}" if count > 1 else failure for failure, count in failures.items()
    )
    print(listed)
    assert not fuzzer.failures, f"{len(fuzzer.failures)} failure(s):\n{listed}"
    return (
        f"console_pages={fuzzer.readers.pages} (all {len(GET_ROUTES)} routes) "
        f"mcp_calls={fuzzer.readers.mcp_calls} (none failed, {fuzzer.readers.seconds:.0f}s) "
        f"cli_runs={cli_runs} (none failed), "
        f"accepted={len(model.accepted_tools)} tools + "
        f"{len(model.accepted_approvals)} approvals all DONE {dict(sorted(statuses.items()))}, "
        f"recorded_rejections={len(model.rejected)} "
        f"executed={len(executions)} (never a rejected one, none twice) "
        f"decided_while_fuzzing={len(model.decided)} decided_after={decided_by_hand} "
        f"published={len(model.published)} delivered_by_ReadEnvelopes={delivered}"
    )


# -- malformed envelopes into RunAgent ---------------------------------------------------

HUGE_EVENT_BYTES = 2 * 1024 * 1024


async def remember(ctx: ActivationContext) -> Complete:
    """Keep the event in working memory (capped at 1 MiB) and complete."""
    ctx.memory.append("events", ctx.event, max_items=4)
    return Complete(output=ctx.entity_key + b":" + str(ctx.seq).encode())


@dataclass
class Mix:
    """The elements fed to ``RunAgent`` and what each must become."""

    elements: list[Any] = field(default_factory=list)
    errors: Counter[tuple[str, bytes]] = field(default_factory=Counter)
    """(reason, the envelope the record must carry) per bad element; ``b""`` for elements
    that hold no envelope."""
    outputs: Counter[bytes] = field(default_factory=Counter)

    def bad(self, element: Any, reason: ErrorReason) -> None:
        self.elements.append(element)
        carried = element[1] if isinstance(element, tuple) and len(element) == 2 else None
        envelope = carried.SerializeToString() if isinstance(carried, AgentEnvelope) else b""
        self.errors[(reason.value, envelope)] += 1


def malformed_elements(rng: random.Random, count: int) -> Mix:
    """A seeded mix of good events and bad elements of every kind, with their expectations."""
    mix = Mix()
    seqs: Counter[bytes] = Counter()

    def envelope(key: bytes, **payload: Any) -> AgentEnvelope:
        return AgentEnvelope(entity_key=key, event_time_ms=rng.randrange(1, 2**40), **payload)

    for index in range(count):
        key = f"key-{rng.randrange(40)}".encode()
        lonely = f"lonely-{index}".encode()
        kind = rng.randrange(9)
        if kind == 0:
            mix.bad((b"", envelope(b"", external_event=b"e")), ErrorReason.EMPTY_KEY)
        elif kind == 1:
            mix.bad((key, envelope(key + b"-other", external_event=b"e")), ErrorReason.KEY_MISMATCH)
        elif kind == 2:
            mix.bad((key, envelope(key)), ErrorReason.MISSING_PAYLOAD)
        elif kind == 3:
            result = ToolResult(intent_id=fresh_id(), status=ToolResult.OK)
            mix.bad((lonely, envelope(lonely, tool_result=result)), ErrorReason.ORPHANED_RESULT)
        elif kind == 4:
            approval = Approval(intent_id=fresh_id(), approved=True)
            mix.bad((lonely, envelope(lonely, approval=approval)), ErrorReason.ORPHANED_RESULT)
        elif kind == 5:
            not_envelopes: list[Any] = [
                "text",
                42,
                None,
                b"bytes",
                (key, b"raw"),
                (key,),
                (key, envelope(key, external_event=b"e"), "extra"),
                ("text-key", envelope(key, external_event=b"e")),
            ]
            mix.bad(rng.choice(not_envelopes), ErrorReason.MALFORMED_ELEMENT)
        else:
            mix.elements.append((key, envelope(key, external_event=rng.randbytes(16))))
            mix.outputs[key + b":" + str(seqs[key]).encode()] += 1
            seqs[key] += 1
    huge = b"huge-key"
    for _ in range(2):
        too_big = envelope(huge, external_event=b"x" * HUGE_EVENT_BYTES)
        mix.bad((huge, too_big), ErrorReason.ACTIVATION_ERROR)
    return mix


def test_malformed_envelopes_become_typed_errors_and_the_pipeline_completes(
    gate_report: Callable[[str, str], None],
) -> None:
    seed = 8_675_309
    mix = malformed_elements(random.Random(seed), 400)
    outputs = run_agent(created(mix.elements, typed=False), remember, AgentConfig())
    # Each bad element became one record with its documented reason, carrying its envelope
    # (so it can be re-driven); every good event ran, in order per key.
    assert Counter((error.reason, error.envelope) for error in outputs.errors) == mix.errors
    assert {error.reason for error in outputs.errors} <= {r.value for r in ErrorReason}
    assert all(error.detail for error in outputs.errors)
    for error in outputs.errors:
        if error.reason == ErrorReason.ACTIVATION_ERROR:
            assert "MemoryLimitError" in error.detail, error.detail
    assert Counter(outputs.output) == mix.outputs
    reasons = Counter(error.reason for error in outputs.errors)
    gate_report(
        "bad-input",
        f"RunAgent: seed={seed} elements={len(mix.elements)} good={sum(mix.outputs.values())} "
        f"outputs={len(outputs.output)} errors={dict(sorted(reasons.items()))} (each one "
        "record with a documented reason and its envelope; pipeline completed)",
    )


def test_an_event_too_large_for_one_effector_request_is_refused_when_the_pipeline_is_built() -> (
    None
):
    fine = AgentEnvelope(entity_key=b"k", external_event=b"x")
    too_large = AgentEnvelope(entity_key=b"k", external_event=b"x" * (16 * 1024 * 1024))
    with pytest.raises(ValueError, match=r"event 1 is \d+ bytes, over the \d+-byte limit"):
        ReadEnvelopes("127.0.0.1:1", events=[fine, too_large])
