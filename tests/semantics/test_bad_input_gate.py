# mypy: disallow-untyped-calls=False
"""Bad-input gate: fuzzing every effector RPC, and malformed envelopes into ``RunAgent``.

**The effector.** One real effector (a subprocess serving the gate tools, on SQLite) takes
property-based fuzzing of all seven RPCs (hypothesis, derandomized so every run is the same,
at least 5,000 cases in all):

- random bytes through a generic method handle (identity serializers): bytes that do not
  parse are INVALID_ARGUMENT; bytes that do parse must be answered exactly as the parsed
  message would be;
- random structurally valid messages: intents with good or bad ids, keys, kinds, tool names,
  arguments and expiries (each generated with the flaw it carries, if any), reads, lookups,
  decisions, publications, status and listings.

A model of the effector's contract (written from its documentation, not its code) predicts
each answer: the status code, and for Submit the outcome of every acknowledgement. After
each batch the health check must say SERVING. At the end every ACCEPTED intent must reach
DONE, no intent that was not accepted may ever have run (the gate tools record every
execution), and no intent may have run twice.

**RunAgent.** A seeded mix of good events and malformed elements (empty key, key mismatch,
no payload, results and approvals for keys with nothing pending, a huge event, values that
are not envelopes at all) runs through ``RunAgent`` on the FnApiRunner: each bad element
becomes one ``.errors`` record with its documented reason, good ones still run, and the
pipeline completes.
"""

from __future__ import annotations

import itertools
import json
import random
import re
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
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
from beam_agents._protos import AgentEnvelope, Approval, ToolIntent, ToolResult, canonical_json
from beam_agents.core.agent import ErrorReason
from beam_agents.core.context import ActivationContext
from beam_agents.io import ReadEnvelopes
from effector.launch import free_port
from tests.core.harness import created, run_agent
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
}
RANDOM_BYTE_CASES = 350
"""Per RPC: 7 x 350 = 2,450 cases of random bytes."""
STRUCTURED_CASES = {
    "Submit": 1_200,
    "Read": 300,
    "GetIntent": 300,
    "Decide": 300,
    "Publish": 300,
    "Status": 1,
    "ListIntents": 300,
}
"""2,701 cases of structurally valid messages (a pb.StatusRequest has no fields: one case)."""
MIN_CASES = 5_000
CALL_TIMEOUT_S = 10.0
APPROVAL_EXPIRY_WAIT_S = 2.5
"""How long after its Submit every short-lived generated approval has expired."""

# The contract's limits, as the effector documents them.
MAX_BATCH = 1_000
MAX_TEXT_FIELD_CHARS = 4_096
DEFAULT_READ_BATCH, MAX_READ_BATCH = 500, 5_000
DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT = 100, 1_000
LISTABLE_STATES = {
    pb.IntentState.PENDING,
    pb.IntentState.RUNNING,
    pb.IntentState.AWAITING_DECISION,
    pb.IntentState.DONE,
    pb.IntentState.IN_DOUBT,
}
CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
FUZZ_SETTINGS = settings(
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)

INVALID = grpc.StatusCode.INVALID_ARGUMENT
OK = grpc.StatusCode.OK


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
    cases: Counter[str] = field(default_factory=Counter)

    def known_ids(self) -> list[str]:
        return sorted(self.recorded)


def well_identified(intent: ToolIntent) -> bool:
    """A canonical (lowercase, hyphenated) UUID and a non-empty key: the effector records it."""
    return bool(CANONICAL_UUID.fullmatch(intent.intent_id)) and bool(intent.entity_key)


def check_submit(
    model: Model,
    request: pb.SubmitRequest,
    code: grpc.StatusCode,
    response: pb.SubmitResponse | None,
    flaws: list[str | None] | None,
) -> None:
    """The contract of Submit; ``flaws`` says which intents must be rejected, when known."""
    count = len(request.intents)
    if count == 0 or count > MAX_BATCH:
        assert code == INVALID, (count, code)
        return
    assert code == OK and response is not None, code
    assert len(response.acks) == count
    for position, (intent, ack) in enumerate(zip(request.intents, response.acks, strict=True)):
        if not well_identified(intent):
            assert ack.outcome == pb.SubmitAck.REJECTED and ack.reason, ack
            assert ack.intent_id == intent.intent_id[:128]
            continue
        assert ack.intent_id == intent.intent_id
        blob = intent.SerializeToString(deterministic=True)
        first = model.recorded.get(intent.intent_id)
        if first is not None:
            if first == blob:
                assert ack.outcome == pb.SubmitAck.DUPLICATE, ack
            else:
                assert ack.outcome == pb.SubmitAck.REJECTED and "conflict" in ack.reason, ack
            continue
        model.recorded[intent.intent_id] = blob
        if flaws is not None:
            expected = pb.SubmitAck.ACCEPTED if flaws[position] is None else pb.SubmitAck.REJECTED
            assert ack.outcome == expected, (flaws[position], ack)
        assert ack.outcome in (pb.SubmitAck.ACCEPTED, pb.SubmitAck.REJECTED), ack
        if ack.outcome == pb.SubmitAck.REJECTED:
            assert ack.reason
            model.rejected.add(intent.intent_id)
        elif intent.kind == ToolIntent.APPROVAL:
            model.accepted_approvals.add(intent.intent_id)
        else:
            model.accepted_tools.add(intent.intent_id)


def check_read(
    request: pb.ReadRequest, code: grpc.StatusCode, response: pb.ReadResponse | None
) -> None:
    if request.from_offset < 0 or request.max_batch < 0 or request.wait_ms < 0:
        assert code == INVALID, code
        return
    assert code == OK and response is not None, code
    start = max(request.from_offset, 1)
    offsets = [record.offset for record in response.records]
    assert offsets == list(range(start, start + len(offsets)))
    assert len(offsets) <= min(request.max_batch or DEFAULT_READ_BATCH, MAX_READ_BATCH)
    assert response.next_offset == (offsets[-1] + 1 if offsets else start)


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
    assert code == OK and response is not None, code
    if response.applied:
        # Only an accepted approval, once (it may also have expired first: then not applied).
        assert request.intent_id in model.accepted_approvals, request.intent_id
        assert request.intent_id not in model.decided, "an approval was decided twice"
        model.decided.add(request.intent_id)
    else:
        assert response.reason


def check_publish(request: pb.PublishRequest, code: grpc.StatusCode, response: Any) -> None:
    envelopes = request.envelopes
    bad = any(
        not envelope.entity_key or envelope.WhichOneof("payload") != "external_event"
        for envelope in envelopes
    )
    if not envelopes or len(envelopes) > MAX_BATCH or bad:
        assert code == INVALID, code
        return
    assert code == OK and response is not None, code
    offsets = list(response.offsets)
    assert offsets == list(range(offsets[0], offsets[0] + len(envelopes)))


def check_status(code: grpc.StatusCode, response: Any) -> None:
    assert code == OK and response is not None, code
    assert response.in_flight == response.pending + response.running + response.awaiting_decision


def check_list(
    model: Model, request: pb.ListIntentsRequest, code: grpc.StatusCode, response: Any
) -> None:
    if request.state not in LISTABLE_STATES or request.limit < 0:
        assert code == INVALID, code
        return
    assert code == OK and response is not None, code
    assert len(response.intents) <= min(request.limit or DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT)
    for intent in response.intents:
        assert intent.intent_id in model.recorded


# -- talking to the server ----------------------------------------------------------------


@dataclass
class Fuzzer:
    """One channel to the server, typed and raw method handles, and the model."""

    channel: grpc.Channel
    model: Model = field(default_factory=Model)

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
        flaws: list[str | None] | None = None,
    ) -> None:
        """Hold one answer against the model of the contract."""
        assert code not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), (name, code)
        if name == "Submit":
            assert isinstance(request, pb.SubmitRequest)
            check_submit(self.model, request, code, response, flaws)
        elif name == "Read":
            assert isinstance(request, pb.ReadRequest)
            check_read(request, code, response)
        elif name == "GetIntent":
            assert isinstance(request, pb.GetIntentRequest)
            check_get_intent(self.model, request, code, response)
        elif name == "Decide":
            assert isinstance(request, pb.DecideRequest)
            check_decide(self.model, request, code, response)
        elif name == "Publish":
            assert isinstance(request, pb.PublishRequest)
            check_publish(request, code, response)
        elif name == "Status":
            check_status(code, response)
        else:
            assert isinstance(request, pb.ListIntentsRequest)
            check_list(self.model, request, code, response)

    def healthy(self) -> bool:
        response = health_pb2_grpc.HealthStub(self.channel).Check(
            health_pb2.HealthCheckRequest(service=SERVICE), timeout=CALL_TIMEOUT_S
        )
        return bool(response.status == health_pb2.HealthCheckResponse.SERVING)


# -- strategies ---------------------------------------------------------------------------

_FRESH = itertools.count()
INT64 = st.integers(-(2**62), 2**62)


def fresh_id() -> str:
    """A new canonical id, reproducibly (hypothesis alone would repeat simple UUIDs a lot)."""
    return str(uuid.uuid5(uuid.NAMESPACE_OID, f"gate-fuzz-{next(_FRESH)}"))


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
    return st.fixed_dictionaries({"note": st.text(max_size=40)})


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
    )


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


@st.composite
def intents(draw: st.DrawFn) -> tuple[ToolIntent, str | None]:
    """A structurally valid intent and the flaw it carries (``None``: it must be accepted)."""
    flaw: str | None = None
    # An int, not a ToolIntent.Kind: proto3 enums are open, and unknown kinds are drawn too.
    kind: int = draw(st.sampled_from([ToolIntent.TOOL, ToolIntent.TOOL, ToolIntent.APPROVAL]))
    if draw(st.integers(0, 9)) == 0:
        flaw, kind = "unknown_kind", draw(st.sampled_from([0, 3, 4, 99]))
    # Times are drawn relative to now, so that what is drawn does not depend on the clock.
    now_ms = int(time.time() * 1000)
    created = draw(st.one_of(st.just(0).map(lambda _: now_ms), INT64))
    if kind == ToolIntent.APPROVAL:
        # Created now or in the past, with a TTL short enough that most expire (and so reach
        # DONE) within seconds, or long enough to be decided while Decide is fuzzed; the
        # window is anchored at max(created, receipt).
        created = now_ms - draw(st.integers(0, 3_600_000))
        tool_name = draw(st.text(max_size=20))
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
        # Capped at int64's largest value: created and the TTL are each drawn up to 2**62.
        latest = 2**63 - 1
        expires = draw(
            st.one_of(st.just(0), INT64.map(lambda w: min(created + abs(w) + 1, latest)))
        )
    if flaw is None and draw(st.integers(0, 9)) == 0:
        flaw = "expiry_before_created"
        expires = created - draw(st.integers(1, 2**40))
        assume(expires != 0)
    identity = draw(st.integers(0, 9))
    if identity == 0:
        flaw, intent_id, key = "malformed_id", draw(malformed_ids()), draw(st.binary(max_size=8))
    elif identity == 1:
        flaw, intent_id, key = "empty_key", draw(good_ids()), b""
    else:
        intent_id, key = draw(good_ids()), draw(st.binary(min_size=1, max_size=24))
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
    key = st.one_of(st.just(b""), st.binary(min_size=1, max_size=16))
    time_ms = st.integers(0, 2**50)
    return st.one_of(
        st.builds(
            lambda k, t, e: AgentEnvelope(entity_key=k, event_time_ms=t, external_event=e),
            key,
            time_ms,
            st.binary(max_size=64),
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


# -- the effector fuzzing gate ------------------------------------------------------------


@pytest.fixture
def fuzzer(tmp_path: Path, ledger: Path) -> Iterator[Fuzzer]:
    store = f"sqlite:///{tmp_path / 'effector.db'}"
    with (
        sidecar(store, free_port(), ledger) as effector,
        grpc.insecure_channel(effector.address) as channel,
    ):
        yield Fuzzer(channel)


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
            assert code == INVALID, (name, payload, code)
        else:
            fuzzer.check(name, parsed, code, response)

    case()


def pick(ids: list[str], index: int) -> str:
    """The ``index``-th id (wrapping around), or a fresh one if there are none yet."""
    return ids[index % len(ids)] if ids else fresh_id()


def fuzz_structured(fuzzer: Fuzzer, name: str) -> None:
    model = fuzzer.model
    # An index drawn, then taken into the ids known when the case runs: what is drawn must
    # not depend on state outside the strategy.
    known = st.integers(0, 2**16).map(lambda n: pick(model.known_ids(), n))
    approvals = st.integers(0, 2**16).map(lambda n: pick(sorted(model.accepted_approvals), n))
    any_id = st.one_of(known, approvals, good_ids(), malformed_ids())
    texts = st.one_of(st.text(max_size=30), st.just("x" * (MAX_TEXT_FIELD_CHARS + 1)))
    requests: dict[str, st.SearchStrategy[tuple[Message, list[str | None] | None]]] = {
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
        ).map(lambda r: (r, None)),
        "GetIntent": st.builds(pb.GetIntentRequest, intent_id=any_id).map(lambda r: (r, None)),
        "Decide": st.builds(
            pb.DecideRequest, intent_id=any_id, approved=st.booleans(), approver=texts, reason=texts
        ).map(lambda r: (r, None)),
        "Publish": st.one_of(
            st.lists(envelopes(), max_size=6),
            st.integers(1, 3).map(
                lambda n: [AgentEnvelope(entity_key=b"k", external_event=b"e")] * (MAX_BATCH + n)
            ),
        ).map(lambda batch: (pb.PublishRequest(envelopes=batch), None)),
        "Status": st.just((pb.StatusRequest(), None)),
        "ListIntents": st.builds(
            pb.ListIntentsRequest, state=st.integers(-1, 6), limit=st.integers(-3, 2_000)
        ).map(lambda r: (r, None)),
    }

    @settings(FUZZ_SETTINGS, max_examples=STRUCTURED_CASES[name])
    @given(drawn=requests[name])
    def case(drawn: tuple[Message, list[str | None] | None]) -> None:
        request, flaws = drawn
        code, response = fuzzer.call(name, request)
        fuzzer.check(name, request, code, response, flaws)

    case()


def decide_the_rest(fuzzer: Fuzzer) -> int:
    """Deny every approval still awaiting a decision; how many there were.

    The generated approvals expire within seconds, but one that arrived as random bytes may
    have no expiry at all: like any approval, it waits for a human.
    """
    awaiting = fuzzer.stub.ListIntents(
        pb.ListIntentsRequest(state=pb.IntentState.AWAITING_DECISION, limit=MAX_LIST_LIMIT),
        timeout=10,
    ).intents
    for intent in awaiting:
        fuzzer.stub.Decide(
            pb.DecideRequest(intent_id=intent.intent_id, approved=False, approver="gate"),
            timeout=10,
        )
    return len(awaiting)


def wait_until_all_done(fuzzer: Fuzzer, timeout_s: float = 60) -> dict[str, pb.GetIntentResponse]:
    """Every accepted intent, once DONE."""
    waiting = fuzzer.model.accepted_tools | fuzzer.model.accepted_approvals
    done: dict[str, pb.GetIntentResponse] = {}
    deadline = time.monotonic() + timeout_s
    while waiting:
        for intent_id in sorted(waiting):
            record = fuzzer.stub.GetIntent(pb.GetIntentRequest(intent_id=intent_id), timeout=10)
            assert record.found, f"accepted intent {intent_id} was lost"
            if record.state == pb.IntentState.DONE:
                done[intent_id] = record
                waiting.discard(intent_id)
        assert time.monotonic() < deadline, f"{len(waiting)} accepted intent(s) never finished"
        time.sleep(0.2 if waiting else 0)
    return done


def test_fuzzing_every_effector_rpc(
    fuzzer: Fuzzer, ledger: Path, gate_report: Callable[[str, str], None]
) -> None:
    started = time.monotonic()
    last_submit = started
    for name in MESSAGES:
        fuzz_random_bytes(fuzzer, name)
        assert fuzzer.healthy(), f"unhealthy after random bytes to {name}"
        fuzz_structured(fuzzer, name)
        assert fuzzer.healthy(), f"unhealthy after structured {name} requests"
        if name == "Submit":  # only Submit brings intents: none arrives after this
            last_submit = time.monotonic()
    model = fuzzer.model
    cases = sum(model.cases.values())
    assert cases >= MIN_CASES, model.cases

    # The longest approval TTL generated (2 s, from receipt at the latest) and a margin, counted
    # from the last Submit, so that those have expired (the later RPCs' fuzzing takes longer).
    time.sleep(max(0.0, last_submit + APPROVAL_EXPIRY_WAIT_S - time.monotonic()))
    decided_by_hand = decide_the_rest(fuzzer)
    done = wait_until_all_done(fuzzer)
    statuses = Counter(ToolResult.Status.Name(record.result.status) for record in done.values())
    executions = Ledger.read(ledger).invocation_counts()
    # Nothing ran that was not accepted, nothing ran twice, every accepted tool intent that
    # finished OK ran exactly once, and no approval ran at all.
    assert set(executions) <= model.accepted_tools
    assert set(executions.values()) <= {1}
    ran_ok = {i for i in model.accepted_tools if done[i].result.status == ToolResult.OK}
    assert set(executions) == ran_ok
    assert {done[i].result.status for i in model.accepted_tools} <= {
        ToolResult.OK,
        ToolResult.EXPIRED,
    }
    assert fuzzer.healthy()
    random_bytes = sum(n for kind, n in model.cases.items() if kind.endswith("/bytes"))
    gate_report(
        "bad-input",
        f"effector: cases={cases} (random_bytes={random_bytes} "
        f"structured={cases - random_bytes}) over "
        f"{len(MESSAGES)} rpcs, healthy after each of {2 * len(MESSAGES)} batches, "
        f"accepted={len(model.accepted_tools)} tools + {len(model.accepted_approvals)} approvals "
        f"all DONE {dict(sorted(statuses.items()))}, recorded_rejections={len(model.rejected)} "
        f"executed={len(executions)} (never a rejected one, none twice) "
        f"decided_while_fuzzing={len(model.decided)} decided_after={decided_by_hand} "
        f"in {time.monotonic() - started:.0f}s",
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
