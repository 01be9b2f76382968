"""The effector's API boundary over real gRPC: every item a client sends is bounded on its own.

Out-of-range times, oversized or deeply nested JSON, huge envelopes and hostile text each get a
typed refusal of that item alone; the rest of the batch is kept, and nothing crashes later.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from conftest import sqlite_url
from effector_harness import (
    FAST_WORKER,
    BackgroundEffector,
    make_intent,
    running_effector,
    wait_done,
)

import beam_agents._protos as pb
from beam_agents._protos import (
    MAX_ARGS_JSON_BYTES,
    MAX_ATTRIBUTE_VALUE_BYTES,
    MAX_ATTRIBUTES,
    MAX_ENTITY_KEY_BYTES,
    MAX_ENVELOPE_BYTES,
    MAX_JSON_DEPTH,
    MAX_TEXT_FIELD_CHARS,
    MAX_TIME_MS,
    MIN_TIME_MS,
    ActivationRecord,
    AgentEnvelope,
    AgentError,
    IntentState,
    SubmitAck,
    ToolIntent,
    ToolResult,
    TraceEvent,
    approval_digest,
    canonical_json,
    withdrawal_id_for,
)
from beam_agents.io import ReadEnvelopes
from effector.client import AsyncEffectorClient, EffectorClient
from effector.server import ServerSettings
from effector.service import (
    MAX_ERROR_TEXT_CHARS,
    MAX_MESSAGE_BYTES,
    MAX_READ_BYTES,
    MAX_RECORD_BYTES,
    parse_tokens,
)
from effector.store.intents import wall_clock_ms
from tests.io.io_harness import Collector, run_pipeline

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
RTL_OVERRIDE = "\u202e"
HOSTILE_TEXT = f"boom\nINFO effector.audit DECISION approve forged\x1b[31m{RTL_OVERRIDE}lived"
AUDIT = "effector.audit"


def nested(levels: int) -> str:
    """A JSON array nested ``levels`` deep: valid, and a recursion bomb for a naive parser."""
    return "[" * levels + "]" * levels


def args_nested(levels: int) -> str:
    return '{"note":' + nested(levels) + "}"


# -- Submit: one bad intent in a batch is refused alone -----------------------------------------


def _set(field: str, value: object) -> Callable[[ToolIntent], None]:
    return lambda intent: setattr(intent, field, value)


def _expires_2_62_ahead(intent: ToolIntent) -> None:
    intent.expires_at_ms = intent.created_at_ms + 2**62


BAD_INTENTS: dict[str, tuple[Callable[[ToolIntent], None], str]] = {
    "expiry_int64_max": (_set("expires_at_ms", INT64_MAX), "expires_at_ms 9223372036854775807"),
    "expiry_2_62_ahead": (_expires_2_62_ahead, "expires_at_ms"),
    "created_int64_min": (_set("created_at_ms", INT64_MIN), "created_at_ms -9223372036854775808"),
    "args_1000_deep": (_set("args_json", args_nested(1_000)), "args_json nests deeper than 64"),
    "args_200000_deep": (_set("args_json", args_nested(200_000)), "args_json nests deeper"),
    "args_over_cap": (
        _set("args_json", canonical_json({"note": "x" * MAX_ARGS_JSON_BYTES})),
        f"(at most {MAX_ARGS_JSON_BYTES})",
    ),
    "compensation_args_deep": (
        _set("compensate_args_json", nested(MAX_JSON_DEPTH + 1)),
        "compensate_args_json nests deeper",
    ),
    "key_over_cap": (
        _set("entity_key", b"k" * (MAX_ENTITY_KEY_BYTES + 1)),
        f"entity_key of {MAX_ENTITY_KEY_BYTES + 1} bytes",
    ),
    "tool_name_over_cap": (
        _set("tool_name", "t" * (MAX_TEXT_FIELD_CHARS + 1)),
        f"tool_name of {MAX_TEXT_FIELD_CHARS + 1} characters",
    ),
}


@pytest.mark.asyncio
@pytest.mark.parametrize("bad", list(BAD_INTENTS))
async def test_one_out_of_bounds_intent_is_refused_and_the_other_five_are_recorded(
    store_url: str, bad: str
) -> None:
    spoil, reason = BAD_INTENTS[bad]
    good = [make_intent("add", {"a": n}, key=b"batch", step=n) for n in range(5)]
    spoiled = make_intent("record", {"note": "bad"}, key=b"batch", step=5)
    spoil(spoiled)
    async with running_effector(store_url) as effector:
        acks = await effector.client.submit([*good[:2], spoiled, *good[2:]])
        outcomes = [ack.outcome for ack in acks]
        assert outcomes == [SubmitAck.ACCEPTED] * 2 + [SubmitAck.REJECTED] + [outcomes[0]] * 3
        assert reason in acks[2].reason, acks[2].reason
        assert acks[2].intent_id == spoiled.intent_id
        done = await wait_done(effector.client, [intent.intent_id for intent in good])
        assert [done[i.intent_id].result.payload for i in good] == [b"1", b"2", b"3", b"4", b"5"]
        assert not (await effector.client.get_intent(spoiled.intent_id)).found
        status = await effector.client.status()
        assert (status.done, status.pending + status.running) == (5, 0)
        assert await effector.client.health()


@pytest.mark.asyncio
async def test_edge_times_are_accepted(tmp_path: Path) -> None:
    earliest = make_intent("add", {"a": 1}, key=b"edge", step=0, created_at_ms=MIN_TIME_MS)
    latest = make_intent("add", {"a": 2}, key=b"edge", step=1)
    latest.expires_at_ms = MAX_TIME_MS
    deepest = make_intent("", args_nested(MAX_JSON_DEPTH - 1), key=b"ask", kind=ToolIntent.APPROVAL)
    async with running_effector(sqlite_url(tmp_path / "s.db")) as effector:
        acks = await effector.client.submit([earliest, latest, deepest])
        assert [ack.outcome for ack in acks] == [SubmitAck.ACCEPTED] * 3, acks
        await wait_done(effector.client, [earliest.intent_id, latest.intent_id])


# -- Publish and Read: bounded, per envelope, always progressing --------------------------------


def event(payload: bytes, time_ms: int = 1_000, key: bytes = b"k") -> AgentEnvelope:
    return AgentEnvelope(entity_key=key, event_time_ms=time_ms, external_event=payload)


@pytest.mark.asyncio
async def test_publish_refuses_each_out_of_bounds_envelope_alone(tmp_path: Path) -> None:
    largest = MAX_ENVELOPE_BYTES - 64
    batch = [
        event(b"first"),
        event(b"far", 2**62),
        event(b"min", INT64_MIN),
        event(b"after 9999", MAX_TIME_MS + 1),
        event(b"x" * MAX_ENVELOPE_BYTES),
        event(b"\x00" * largest, MAX_TIME_MS),
        event(b"last", MIN_TIME_MS),
    ]
    async with running_effector(sqlite_url(tmp_path / "s.db")) as effector:
        report = await effector.client.publish_report(batch)
        assert list(report.offsets) == [1, 0, 0, 0, 0, 2, 3]
        problems = list(report.problems)
        assert problems[0] == problems[5] == problems[6] == ""
        assert problems[1].startswith("envelope 1 has a time out of range: event_time_ms 46116")
        assert "event_time_ms -9223372036854775808 is outside years 1-9999" in problems[2]
        assert f"event_time_ms {MAX_TIME_MS + 1} is outside" in problems[3]
        assert problems[4].startswith("envelope 4 is ")
        assert f"over the cap of {MAX_ENVELOPE_BYTES}" in problems[4]
        # The probe: a 9 MiB envelope fits in a message but not in the log.
        nine_mib = await effector.client.publish_report([event(b"9" * (9 << 20))])
        assert list(nine_mib.offsets) == [0]
        assert "over the cap" in nine_mib.problems[0]
        read = await effector.client.read(1)
        assert [r.envelope.external_event[:5] for r in read.records] == [
            b"first",
            b"\x00" * 5,
            b"last",
        ]
        assert (await effector.client.status()).head_offset == 3


async def read_everything(client: AsyncEffectorClient, max_bytes: int = 0) -> list[pb.ReadResponse]:
    answers = []
    offset, head = 1, (await client.status()).head_offset
    while offset <= head:
        answer = await client.read(offset, max_bytes=max_bytes)
        assert answer.records, f"no progress at offset {offset}"
        answers.append(answer)
        offset = answer.next_offset
    return answers


def large_log() -> list[AgentEnvelope]:
    """Seven envelopes near the cap, then a small one: four Read answers' worth."""
    return [event(bytes([n]) * (MAX_ENVELOPE_BYTES - 1024), 1_000 + n) for n in range(7)] + [
        event(b"small", 2_000)
    ]


@pytest.mark.asyncio
async def test_read_answers_within_max_bytes_and_always_progresses(tmp_path: Path) -> None:
    log = large_log()
    async with running_effector(sqlite_url(tmp_path / "s.db")) as effector:
        client = effector.client
        for start in range(0, len(log), 3):  # three near-cap envelopes fit in one request
            report = await client.publish_report(log[start : start + 3])
            assert not any(report.problems)
        answers = await read_everything(client)
        delivered = [r.envelope for answer in answers for r in answer.records]
        assert delivered == log
        for answer in answers:
            assert answer.ByteSize() <= MAX_READ_BYTES + 1024
        assert [len(answer.records) for answer in answers] == [2, 2, 2, 2]
        one_by_one = await read_everything(client, max_bytes=1)
        assert [len(answer.records) for answer in one_by_one] == [1] * len(log)
        small = await client.read(8, max_bytes=1)
        assert [r.envelope for r in small.records] == [log[7]]
        over_cap = await client.read(1, max_bytes=MAX_MESSAGE_BYTES)
        assert len(over_cap.records) == 2
        with pytest.raises(grpc.aio.AioRpcError) as negative:
            await client.read(1, max_bytes=-1)
        assert negative.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_read_envelopes_pipeline_delivers_every_accepted_envelope(tmp_path: Path) -> None:
    log = large_log()
    with BackgroundEffector(sqlite_url(tmp_path / "s.db")) as effector:
        with EffectorClient(effector.address) as client:
            for start in range(0, len(log), 3):
                client.publish(log[start : start + 3])
            assert client.publish([event(b"9" * (9 << 20))]) == [0]
        collector = Collector.new()
        transform = ReadEnvelopes(effector.address, stop_when_idle_s=1.0, poll_wait_ms=50)
        with ThreadPoolExecutor(max_workers=1) as pool:
            running = pool.submit(run_pipeline, lambda p: p | transform | collector.sink())
            running.result(timeout=120)
    assert collector.values() == [(b"k", envelope) for envelope in log]


# -- Record*: per-item refusals of times, sizes and depth ---------------------------------------


def trace(n: int, **fields: object) -> TraceEvent:
    """A valid trace event (span ``n``), with ``fields`` changed."""
    values: dict[str, object] = {
        "trace_id": "a" * 32,
        "span_id": f"{n:016x}",
        "entity_key": b"traced",
        "start_ms": 1_000,
        "end_ms": 1_001,
    }
    return TraceEvent(**(values | fields))  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_record_traces_refuses_each_out_of_bounds_event_alone(tmp_path: Path) -> None:
    bad_events = [
        (trace(101, start_ms=INT64_MAX), "start_ms 9223372036854775807 is outside"),
        (trace(102, end_ms=INT64_MIN), "end_ms -9223372036854775808 is outside"),
        (trace(103, start_ms=2**62), "start_ms 4611686018427387904"),
        (trace(104, wall_start_unix_nano=-1), "wall_start_unix_nano -1"),
        (trace(105, attributes={"json": nested(20_000)}), "'json' nests deeper than 64"),
        (trace(108, attributes={"json": nested(200_000)}), "'json' of 400000 bytes"),
        (
            trace(106, attributes={str(n): "v" for n in range(MAX_ATTRIBUTES + 1)}),
            f"{MAX_ATTRIBUTES + 1} attributes",
        ),
        (
            trace(107, attributes={"big": "v" * (MAX_ATTRIBUTE_VALUE_BYTES + 1)}),
            f"(at most {MAX_ATTRIBUTE_VALUE_BYTES})",
        ),
    ]
    async with running_effector(sqlite_url(tmp_path / "s.db")) as effector:
        stub = pb.EffectorStub(effector.client._channel)  # type: ignore[no-untyped-call]
        for n, (bad, problem) in enumerate(bad_events):
            answer = await stub.RecordTraces(pb.RecordTracesRequest(events=[trace(n), bad]))
            assert (answer.recorded, answer.rejected) == (1, 1), answer
            assert answer.first_problem.startswith("event 1 ")
            assert problem in answer.first_problem, answer.first_problem
        kept = await effector.store.traces_for_key(b"traced", 10)
        assert sorted(event.span_id for event in kept) == [f"{n:016x}" for n in range(8)]


@pytest.mark.asyncio
async def test_only_json_shaped_attribute_values_are_depth_checked(tmp_path: Path) -> None:
    plain = {
        "opening": "[" * 5_000 + " not JSON",
        "closing": "(" + "}" * 5_000,
        "bidi": "\u202e" + "{" * 3_000 + "\x00",
    }
    shaped = {"spaced": " \n" + nested(100) + "\t ", "object": '{"a":' + nested(70) + "}"}
    async with running_effector(sqlite_url(tmp_path / "s.db")) as effector:
        stub = pb.EffectorStub(effector.client._channel)  # type: ignore[no-untyped-call]
        for n, (name, value) in enumerate(plain.items()):
            answer = await stub.RecordTraces(
                pb.RecordTracesRequest(events=[trace(n, attributes={name: value})])
            )
            assert (answer.recorded, answer.rejected) == (1, 0), (name, answer)
        for n, (name, value) in enumerate(shaped.items(), start=len(plain)):
            answer = await stub.RecordTraces(
                pb.RecordTracesRequest(events=[trace(n, attributes={name: value})])
            )
            assert (answer.recorded, answer.rejected) == (0, 1), (name, answer)
            assert "nests deeper than 64" in answer.first_problem
        kept = await effector.store.traces_for_key(b"traced", 10)
        assert sorted(item for event in kept for item in event.attributes.items()) == sorted(
            plain.items()
        )


@pytest.mark.asyncio
async def test_record_errors_and_activations_refuse_each_out_of_bounds_item_alone(
    tmp_path: Path,
) -> None:
    far = AgentEnvelope(entity_key=b"e", event_time_ms=INT64_MIN, external_event=b"x")
    late_result = AgentEnvelope(
        entity_key=b"e", tool_result=ToolResult(intent_id="x", completed_at_ms=2**62)
    )
    bad_errors = [
        (AgentError(entity_key=b"e", reason="r", event_time_ms=2**62), "event_time_ms"),
        (
            AgentError(entity_key=b"e", reason="r", detail="d" * (MAX_ERROR_TEXT_CHARS + 1)),
            "detail",
        ),
        (
            AgentError(entity_key=b"e", reason="r", traceback="t" * (MAX_ERROR_TEXT_CHARS + 1)),
            "traceback",
        ),
        (AgentError(entity_key=b"e", reason="r", envelope=far.SerializeToString()), "envelope"),
        (AgentError(entity_key=b"e", reason="r\n" * MAX_TEXT_FIELD_CHARS), "reason of"),
    ]
    far_intent = make_intent("add", {"a": 1}, key=b"e")
    far_intent.expires_at_ms = INT64_MAX
    bad_records = [
        (ActivationRecord(entity_key=b"e", seq=1, envelope=far), "envelope.event_time_ms"),
        (ActivationRecord(entity_key=b"e", seq=2, envelope=late_result), "completed_at_ms"),
        (ActivationRecord(entity_key=b"e", seq=3, intents=[far_intent]), "intents.expires_at_ms"),
        (
            ActivationRecord(
                entity_key=b"e",
                seq=4,
                tool_calls=[pb.RecordedToolCall(tool_name="t", args_json=nested(200_000))],
            ),
            "tool_calls.args_json nests deeper",
        ),
        (
            ActivationRecord(
                entity_key=b"e", seq=5, continuation_before=pb.Continuation(deadline_ms=2**62)
            ),
            "continuation_before.deadline_ms",
        ),
        (
            ActivationRecord(entity_key=b"e", seq=6, snapshot=b"s" * MAX_RECORD_BYTES),
            f"(at most {MAX_RECORD_BYTES})",
        ),
    ]
    async with running_effector(sqlite_url(tmp_path / "s.db")) as effector:
        stub = pb.EffectorStub(effector.client._channel)  # type: ignore[no-untyped-call]
        for n, (bad_error, problem) in enumerate(bad_errors):
            valid = AgentError(entity_key=b"e", reason="ok", seq=n)
            errors = await stub.RecordErrors(pb.RecordErrorsRequest(errors=[valid, bad_error]))
            assert (errors.recorded, errors.rejected) == (1, 1), errors
            assert problem in errors.first_problem, errors.first_problem
        for n, (bad_record, problem) in enumerate(bad_records):
            valid_record = ActivationRecord(entity_key=b"e", seq=100 + n)
            answer = await stub.RecordActivations(
                pb.RecordActivationsRequest(records=[bad_record, valid_record])
            )
            assert (answer.recorded, answer.rejected) == (1, 1), answer
            assert answer.first_problem.startswith("record 0 ")
            assert problem in answer.first_problem, answer.first_problem
        listed = await stub.ListRecords(pb.ListRecordsRequest(entity_key=b"e"))
        assert sorted(record.seq for record in listed.records) == list(range(100, 106))
        with pytest.raises(grpc.aio.AioRpcError) as too_long:
            await stub.ListRecords(
                pb.ListRecordsRequest(entity_key=b"k" * (MAX_ENTITY_KEY_BYTES + 1))
            )
        assert too_long.value.code() == grpc.StatusCode.INVALID_ARGUMENT


# -- Decide: typed refusals, one log line per attempt, the store's reason unchanged -------------


def decision_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == AUDIT and record.getMessage().startswith("DECISION")
    ]


@pytest.mark.asyncio
async def test_every_decision_attempt_logs_one_line_and_bad_edits_are_invalid_arguments(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=AUDIT)
    tokens = parse_tokens("alice:tok-alice\nbob:tok-bob", "tokens")
    settings = ServerSettings(tokens=tokens, worker=FAST_WORKER)
    approval = make_intent("", {"a": 1}, key=b"ask", kind=ToolIntent.APPROVAL)
    approval.gated_tool = "add"
    unknown = str(uuid.uuid4())
    async with (
        running_effector(sqlite_url(tmp_path / "s.db"), settings=settings) as effector,
        AsyncEffectorClient(effector.server.address, token="tok-alice") as alice,
    ):
        await alice.submit([approval])
        for edit in (args_nested(200_000), canonical_json({"a": 1, "pad": "x" * (1 << 21)})):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await alice.decide(approval.intent_id, approved=True, edited_args_json=edit)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "edited_args_json" in (refused.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as bad_id:
            await alice.decide("not-a-uuid", approved=False)
        assert bad_id.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert not (await alice.decide(unknown, approved=True)).applied
        digest = approval_digest(approval.args_json)
        applied = await alice.decide(approval.intent_id, approved=True, args_digest=digest)
        assert applied.applied
        again = await alice.decide(approval.intent_id, approved=False)
        assert not again.applied
    lines = decision_lines(caplog)
    assert len(lines) == 6, lines
    via = re.compile(r" via gRPC from ipv4:127\.0\.0\.1:\d+:")
    assert all(via.search(line) for line in lines), lines
    lines = [via.sub(":", line) for line in lines]
    prefix = f"DECISION approve intent {approval.intent_id} by 'alice': "
    assert lines[0].startswith(prefix + "not applied (invalid request: the decision has JSON")
    assert lines[1].startswith(prefix + "not applied (invalid request: the decision has ")
    assert lines[2].startswith("DECISION deny intent not-a-uuid by 'alice': not applied (invalid")
    assert lines[3] == f"DECISION approve intent {unknown} by 'alice': not applied (unknown intent)"
    assert lines[4] == prefix + "applied"
    assert lines[5] == (
        f"DECISION deny intent {approval.intent_id} by 'alice': not applied ({again.reason})"
    )


@pytest.mark.asyncio
async def test_deciding_a_withdrawn_approval_answers_the_stores_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=AUDIT)
    approval = make_intent("", {"a": 1}, key=b"gone", kind=ToolIntent.APPROVAL)
    withdrawal = ToolIntent(
        intent_id=withdrawal_id_for(approval.intent_id),
        entity_key=b"gone",
        seq=0,
        step_index=1,
        kind=ToolIntent.WITHDRAWAL,
        withdraws_intent_id=approval.intent_id,
        args_json=canonical_json({"reason": "the run took its deadline route"}),
        created_at_ms=wall_clock_ms(),
    )
    async with running_effector(sqlite_url(tmp_path / "s.db")) as effector:
        await effector.client.submit([approval])
        [ack] = await effector.client.submit([withdrawal])
        assert ack.outcome == SubmitAck.ACCEPTED, ack
        assert (await effector.client.get_intent(approval.intent_id)).state == (
            IntentState.WITHDRAWN
        )
        decision = await effector.client.decide(approval.intent_id, approved=True, approver="ann")
    assert not decision.applied
    assert decision.state == IntentState.WITHDRAWN
    assert decision.reason.startswith("withdrawn"), decision.reason
    [line] = decision_lines(caplog)
    assert re.sub(r" via gRPC from ipv4:127\.0\.0\.1:\d+:", ":", line) == (
        f"DECISION approve intent {approval.intent_id} by 'ann': not applied ({decision.reason})"
    )


# -- the log: what a client sent never forges or hides a line -----------------------------------


@pytest.mark.asyncio
async def test_logged_values_have_control_newline_and_bidi_characters_escaped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    failing = make_intent("fail", {"message": HOSTILE_TEXT}, key=b"hostile")
    approval = make_intent("", {"to": f"acct-{RTL_OVERRIDE}4321"}, key=b"ask2", kind=2)
    async with running_effector(sqlite_url(tmp_path / "s.db")) as effector:
        await effector.client.submit([failing, approval])
        done = await wait_done(effector.client, [failing.intent_id])
        assert done[failing.intent_id].result.status == ToolResult.ERROR
        await effector.client.decide(
            approval.intent_id, approved=False, approver=f"eve\n{RTL_OVERRIDE}", reason="no"
        )
        stub = pb.EffectorStub(effector.client._channel)  # type: ignore[no-untyped-call]
        await stub.RecordTraces(pb.RecordTracesRequest(events=[trace(1, trace_id=HOSTILE_TEXT)]))
    logged = [
        record.getMessage() for record in caplog.records if record.name.startswith("effector")
    ]
    error_lines = [line for line in logged if line.startswith("ERROR intent")]
    assert len(error_lines) == 1
    assert (
        "boom\\nINFO effector.audit DECISION approve forged\\x1b[31m\\u202elived"
        in (error_lines[0])
    )
    assert any(line.startswith("DECISION deny") and "eve\\n\\u202e" in line for line in logged)
    assert any(line.startswith("RecordTraces: refused 1 of 1") for line in logged)
    for line in logged:
        assert not any(char in line for char in ("\n", "\x1b", RTL_OVERRIDE)), repr(line)


# -- the bearer scheme is case-insensitive -----------------------------------------------------


@pytest.mark.asyncio
async def test_the_bearer_scheme_is_case_insensitive(tmp_path: Path) -> None:
    tokens = parse_tokens("alice:tok-alice\nbob:tok-bob", "tokens")
    settings = ServerSettings(tokens=tokens, worker=FAST_WORKER)
    async with running_effector(sqlite_url(tmp_path / "s.db"), settings=settings) as effector:
        async with grpc.aio.insecure_channel(effector.server.address) as channel:
            stub = pb.EffectorStub(channel)  # type: ignore[no-untyped-call]
            for scheme in ("bearer", "BEARER", "bEaReR", "Bearer"):
                metadata = (("authorization", f"{scheme} tok-bob"),)
                status = await stub.Status(pb.StatusRequest(), metadata=metadata, timeout=10)
                assert status.head_offset == 0
            for refused in ("Basic tok-bob", "Bearertok-bob", "tok-bob", "bearer tok-bo"):
                with pytest.raises(grpc.aio.AioRpcError) as error:
                    await stub.Status(
                        pb.StatusRequest(), metadata=(("authorization", refused),), timeout=10
                    )
                assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED, refused
            approval = make_intent("", {"a": 1}, key=b"ask", kind=ToolIntent.APPROVAL)
            lower = (("authorization", "bearer tok-bob"),)
            await stub.Submit(pb.SubmitRequest(intents=[approval]), metadata=lower, timeout=10)
            decided = await stub.Decide(
                pb.DecideRequest(intent_id=approval.intent_id, approved=True, approver="mallory"),
                metadata=lower,
                timeout=10,
            )
        assert decided.applied
        envelopes = await effector.client.read(1)
        assert [r.envelope.approval.approver for r in envelopes.records] == ["bob"]


@pytest.mark.asyncio
async def test_list_intents_answers_fit_whatever_the_arguments_weigh(tmp_path: Path) -> None:
    heavy = canonical_json({"note": "n" * (MAX_ARGS_JSON_BYTES - 64)})
    approvals = [
        make_intent("", heavy, key=b"ask", step=n, kind=ToolIntent.APPROVAL) for n in range(20)
    ]
    unknown_tool = [make_intent("no_such_tool", heavy, key=b"bad", step=n) for n in range(20)]
    async with running_effector(sqlite_url(tmp_path / "s.db")) as effector:
        client = effector.client
        everything = approvals + unknown_tool
        for start in range(0, len(everything), 10):
            acks = await client.submit(everything[start : start + 10])
            assert all(ack.outcome != SubmitAck.OUTCOME_UNSPECIFIED for ack in acks)
        pending = await client.list_intents(IntentState.AWAITING_DECISION)
        failed = await client.list_failed()
    assert 1 <= len(pending) < len(approvals)
    assert {intent.intent_id for intent in pending} < {intent.intent_id for intent in approvals}
    assert sum(intent.ByteSize() for intent in pending) <= MAX_READ_BYTES
    assert 1 <= len(failed) < len(unknown_tool)
    assert {result.status for _, result in failed} == {ToolResult.REJECTED}
