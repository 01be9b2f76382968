from beam_agents._protos import messages_pb2 as _messages_pb2
from beam_agents._protos import records_pb2 as _records_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class IntentState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INTENT_STATE_UNSPECIFIED: _ClassVar[IntentState]
    PENDING: _ClassVar[IntentState]
    RUNNING: _ClassVar[IntentState]
    AWAITING_DECISION: _ClassVar[IntentState]
    DONE: _ClassVar[IntentState]
    IN_DOUBT: _ClassVar[IntentState]
    WITHDRAWN: _ClassVar[IntentState]
INTENT_STATE_UNSPECIFIED: IntentState
PENDING: IntentState
RUNNING: IntentState
AWAITING_DECISION: IntentState
DONE: IntentState
IN_DOUBT: IntentState
WITHDRAWN: IntentState

class SubmitRequest(_message.Message):
    __slots__ = ("intents", "redeliver_results")
    INTENTS_FIELD_NUMBER: _ClassVar[int]
    REDELIVER_RESULTS_FIELD_NUMBER: _ClassVar[int]
    intents: _containers.RepeatedCompositeFieldContainer[_messages_pb2.ToolIntent]
    redeliver_results: bool
    def __init__(self, intents: _Optional[_Iterable[_Union[_messages_pb2.ToolIntent, _Mapping]]] = ..., redeliver_results: _Optional[bool] = ...) -> None: ...

class SubmitAck(_message.Message):
    __slots__ = ("intent_id", "outcome", "state", "reason", "result")
    class Outcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        OUTCOME_UNSPECIFIED: _ClassVar[SubmitAck.Outcome]
        ACCEPTED: _ClassVar[SubmitAck.Outcome]
        DUPLICATE: _ClassVar[SubmitAck.Outcome]
        REJECTED: _ClassVar[SubmitAck.Outcome]
    OUTCOME_UNSPECIFIED: SubmitAck.Outcome
    ACCEPTED: SubmitAck.Outcome
    DUPLICATE: SubmitAck.Outcome
    REJECTED: SubmitAck.Outcome
    INTENT_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    intent_id: str
    outcome: SubmitAck.Outcome
    state: IntentState
    reason: str
    result: _messages_pb2.ToolResult
    def __init__(self, intent_id: _Optional[str] = ..., outcome: _Optional[_Union[SubmitAck.Outcome, str]] = ..., state: _Optional[_Union[IntentState, str]] = ..., reason: _Optional[str] = ..., result: _Optional[_Union[_messages_pb2.ToolResult, _Mapping]] = ...) -> None: ...

class SubmitResponse(_message.Message):
    __slots__ = ("acks",)
    ACKS_FIELD_NUMBER: _ClassVar[int]
    acks: _containers.RepeatedCompositeFieldContainer[SubmitAck]
    def __init__(self, acks: _Optional[_Iterable[_Union[SubmitAck, _Mapping]]] = ...) -> None: ...

class ReadRequest(_message.Message):
    __slots__ = ("from_offset", "max_batch", "wait_ms", "max_bytes")
    FROM_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    from_offset: int
    max_batch: int
    wait_ms: int
    max_bytes: int
    def __init__(self, from_offset: _Optional[int] = ..., max_batch: _Optional[int] = ..., wait_ms: _Optional[int] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class EnvelopeRecord(_message.Message):
    __slots__ = ("offset", "envelope")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    ENVELOPE_FIELD_NUMBER: _ClassVar[int]
    offset: int
    envelope: _messages_pb2.AgentEnvelope
    def __init__(self, offset: _Optional[int] = ..., envelope: _Optional[_Union[_messages_pb2.AgentEnvelope, _Mapping]] = ...) -> None: ...

class ReadResponse(_message.Message):
    __slots__ = ("records", "next_offset")
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[EnvelopeRecord]
    next_offset: int
    def __init__(self, records: _Optional[_Iterable[_Union[EnvelopeRecord, _Mapping]]] = ..., next_offset: _Optional[int] = ...) -> None: ...

class GetIntentRequest(_message.Message):
    __slots__ = ("intent_id",)
    INTENT_ID_FIELD_NUMBER: _ClassVar[int]
    intent_id: str
    def __init__(self, intent_id: _Optional[str] = ...) -> None: ...

class GetIntentResponse(_message.Message):
    __slots__ = ("found", "state", "intent", "result", "attempts", "in_doubt_reason", "retry_at_ms", "votes", "args_digest", "received_at_ms", "deadline_ms", "policy_rule", "policy_outcome", "policy_gate_id")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    INTENT_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    IN_DOUBT_REASON_FIELD_NUMBER: _ClassVar[int]
    RETRY_AT_MS_FIELD_NUMBER: _ClassVar[int]
    VOTES_FIELD_NUMBER: _ClassVar[int]
    ARGS_DIGEST_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    POLICY_RULE_FIELD_NUMBER: _ClassVar[int]
    POLICY_OUTCOME_FIELD_NUMBER: _ClassVar[int]
    POLICY_GATE_ID_FIELD_NUMBER: _ClassVar[int]
    found: bool
    state: IntentState
    intent: _messages_pb2.ToolIntent
    result: _messages_pb2.ToolResult
    attempts: int
    in_doubt_reason: str
    retry_at_ms: int
    votes: _containers.RepeatedCompositeFieldContainer[_messages_pb2.Approval]
    args_digest: str
    received_at_ms: int
    deadline_ms: int
    policy_rule: str
    policy_outcome: str
    policy_gate_id: str
    def __init__(self, found: _Optional[bool] = ..., state: _Optional[_Union[IntentState, str]] = ..., intent: _Optional[_Union[_messages_pb2.ToolIntent, _Mapping]] = ..., result: _Optional[_Union[_messages_pb2.ToolResult, _Mapping]] = ..., attempts: _Optional[int] = ..., in_doubt_reason: _Optional[str] = ..., retry_at_ms: _Optional[int] = ..., votes: _Optional[_Iterable[_Union[_messages_pb2.Approval, _Mapping]]] = ..., args_digest: _Optional[str] = ..., received_at_ms: _Optional[int] = ..., deadline_ms: _Optional[int] = ..., policy_rule: _Optional[str] = ..., policy_outcome: _Optional[str] = ..., policy_gate_id: _Optional[str] = ...) -> None: ...

class DecideRequest(_message.Message):
    __slots__ = ("intent_id", "approved", "approver", "reason", "args_digest", "edited_args_json")
    INTENT_ID_FIELD_NUMBER: _ClassVar[int]
    APPROVED_FIELD_NUMBER: _ClassVar[int]
    APPROVER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ARGS_DIGEST_FIELD_NUMBER: _ClassVar[int]
    EDITED_ARGS_JSON_FIELD_NUMBER: _ClassVar[int]
    intent_id: str
    approved: bool
    approver: str
    reason: str
    args_digest: str
    edited_args_json: str
    def __init__(self, intent_id: _Optional[str] = ..., approved: _Optional[bool] = ..., approver: _Optional[str] = ..., reason: _Optional[str] = ..., args_digest: _Optional[str] = ..., edited_args_json: _Optional[str] = ...) -> None: ...

class DecideResponse(_message.Message):
    __slots__ = ("applied", "state", "reason", "result")
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    applied: bool
    state: IntentState
    reason: str
    result: _messages_pb2.ToolResult
    def __init__(self, applied: _Optional[bool] = ..., state: _Optional[_Union[IntentState, str]] = ..., reason: _Optional[str] = ..., result: _Optional[_Union[_messages_pb2.ToolResult, _Mapping]] = ...) -> None: ...

class PublishRequest(_message.Message):
    __slots__ = ("envelopes",)
    ENVELOPES_FIELD_NUMBER: _ClassVar[int]
    envelopes: _containers.RepeatedCompositeFieldContainer[_messages_pb2.AgentEnvelope]
    def __init__(self, envelopes: _Optional[_Iterable[_Union[_messages_pb2.AgentEnvelope, _Mapping]]] = ...) -> None: ...

class PublishResponse(_message.Message):
    __slots__ = ("offsets", "problems")
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    offsets: _containers.RepeatedScalarFieldContainer[int]
    problems: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, offsets: _Optional[_Iterable[int]] = ..., problems: _Optional[_Iterable[str]] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("pending", "running", "awaiting_decision", "done", "head_offset", "in_flight", "in_doubt", "withdrawn", "held")
    PENDING_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    AWAITING_DECISION_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    HEAD_OFFSET_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    IN_DOUBT_FIELD_NUMBER: _ClassVar[int]
    WITHDRAWN_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    pending: int
    running: int
    awaiting_decision: int
    done: int
    head_offset: int
    in_flight: int
    in_doubt: int
    withdrawn: int
    held: int
    def __init__(self, pending: _Optional[int] = ..., running: _Optional[int] = ..., awaiting_decision: _Optional[int] = ..., done: _Optional[int] = ..., head_offset: _Optional[int] = ..., in_flight: _Optional[int] = ..., in_doubt: _Optional[int] = ..., withdrawn: _Optional[int] = ..., held: _Optional[int] = ...) -> None: ...

class ListIntentsRequest(_message.Message):
    __slots__ = ("state", "limit", "failed_only")
    STATE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    FAILED_ONLY_FIELD_NUMBER: _ClassVar[int]
    state: IntentState
    limit: int
    failed_only: bool
    def __init__(self, state: _Optional[_Union[IntentState, str]] = ..., limit: _Optional[int] = ..., failed_only: _Optional[bool] = ...) -> None: ...

class ListIntentsResponse(_message.Message):
    __slots__ = ("intents", "results")
    INTENTS_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    intents: _containers.RepeatedCompositeFieldContainer[_messages_pb2.ToolIntent]
    results: _containers.RepeatedCompositeFieldContainer[_messages_pb2.ToolResult]
    def __init__(self, intents: _Optional[_Iterable[_Union[_messages_pb2.ToolIntent, _Mapping]]] = ..., results: _Optional[_Iterable[_Union[_messages_pb2.ToolResult, _Mapping]]] = ...) -> None: ...

class RecordTracesRequest(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[_messages_pb2.TraceEvent]
    def __init__(self, events: _Optional[_Iterable[_Union[_messages_pb2.TraceEvent, _Mapping]]] = ...) -> None: ...

class RecordTracesResponse(_message.Message):
    __slots__ = ("recorded", "duplicates", "rejected", "first_problem")
    RECORDED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    FIRST_PROBLEM_FIELD_NUMBER: _ClassVar[int]
    recorded: int
    duplicates: int
    rejected: int
    first_problem: str
    def __init__(self, recorded: _Optional[int] = ..., duplicates: _Optional[int] = ..., rejected: _Optional[int] = ..., first_problem: _Optional[str] = ...) -> None: ...

class RecordErrorsRequest(_message.Message):
    __slots__ = ("errors",)
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    errors: _containers.RepeatedCompositeFieldContainer[_messages_pb2.AgentError]
    def __init__(self, errors: _Optional[_Iterable[_Union[_messages_pb2.AgentError, _Mapping]]] = ...) -> None: ...

class RecordErrorsResponse(_message.Message):
    __slots__ = ("recorded", "duplicates", "rejected", "first_problem")
    RECORDED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    FIRST_PROBLEM_FIELD_NUMBER: _ClassVar[int]
    recorded: int
    duplicates: int
    rejected: int
    first_problem: str
    def __init__(self, recorded: _Optional[int] = ..., duplicates: _Optional[int] = ..., rejected: _Optional[int] = ..., first_problem: _Optional[str] = ...) -> None: ...

class RecordActivationsRequest(_message.Message):
    __slots__ = ("records",)
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[_records_pb2.ActivationRecord]
    def __init__(self, records: _Optional[_Iterable[_Union[_records_pb2.ActivationRecord, _Mapping]]] = ...) -> None: ...

class RecordActivationsResponse(_message.Message):
    __slots__ = ("recorded", "duplicates", "rejected", "first_problem")
    RECORDED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    FIRST_PROBLEM_FIELD_NUMBER: _ClassVar[int]
    recorded: int
    duplicates: int
    rejected: int
    first_problem: str
    def __init__(self, recorded: _Optional[int] = ..., duplicates: _Optional[int] = ..., rejected: _Optional[int] = ..., first_problem: _Optional[str] = ...) -> None: ...

class ListRecordsRequest(_message.Message):
    __slots__ = ("entity_key", "max_runs", "before_seq", "intent_namespace", "before")
    ENTITY_KEY_FIELD_NUMBER: _ClassVar[int]
    MAX_RUNS_FIELD_NUMBER: _ClassVar[int]
    BEFORE_SEQ_FIELD_NUMBER: _ClassVar[int]
    INTENT_NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    BEFORE_FIELD_NUMBER: _ClassVar[int]
    entity_key: bytes
    max_runs: int
    before_seq: int
    intent_namespace: str
    before: RecordPlace
    def __init__(self, entity_key: _Optional[bytes] = ..., max_runs: _Optional[int] = ..., before_seq: _Optional[int] = ..., intent_namespace: _Optional[str] = ..., before: _Optional[_Union[RecordPlace, _Mapping]] = ...) -> None: ...

class RecordPlace(_message.Message):
    __slots__ = ("seq", "trace_sequence", "intent_namespace")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TRACE_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    INTENT_NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    seq: int
    trace_sequence: int
    intent_namespace: str
    def __init__(self, seq: _Optional[int] = ..., trace_sequence: _Optional[int] = ..., intent_namespace: _Optional[str] = ...) -> None: ...

class ListRecordsResponse(_message.Message):
    __slots__ = ("records", "next_before_seq", "next_before")
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    NEXT_BEFORE_SEQ_FIELD_NUMBER: _ClassVar[int]
    NEXT_BEFORE_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[_records_pb2.ActivationRecord]
    next_before_seq: int
    next_before: RecordPlace
    def __init__(self, records: _Optional[_Iterable[_Union[_records_pb2.ActivationRecord, _Mapping]]] = ..., next_before_seq: _Optional[int] = ..., next_before: _Optional[_Union[RecordPlace, _Mapping]] = ...) -> None: ...

class PoliciesRequest(_message.Message):
    __slots__ = ("limit",)
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    limit: int
    def __init__(self, limit: _Optional[int] = ...) -> None: ...

class PolicyRule(_message.Message):
    __slots__ = ("name", "when", "outcome", "reason", "channel", "approvals", "line", "decisions")
    NAME_FIELD_NUMBER: _ClassVar[int]
    WHEN_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    APPROVALS_FIELD_NUMBER: _ClassVar[int]
    LINE_FIELD_NUMBER: _ClassVar[int]
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    when: str
    outcome: str
    reason: str
    channel: str
    approvals: int
    line: int
    decisions: int
    def __init__(self, name: _Optional[str] = ..., when: _Optional[str] = ..., outcome: _Optional[str] = ..., reason: _Optional[str] = ..., channel: _Optional[str] = ..., approvals: _Optional[int] = ..., line: _Optional[int] = ..., decisions: _Optional[int] = ...) -> None: ...

class PolicyCounter(_message.Message):
    __slots__ = ("name", "tool", "per", "window_ms")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    PER_FIELD_NUMBER: _ClassVar[int]
    WINDOW_MS_FIELD_NUMBER: _ClassVar[int]
    name: str
    tool: str
    per: str
    window_ms: int
    def __init__(self, name: _Optional[str] = ..., tool: _Optional[str] = ..., per: _Optional[str] = ..., window_ms: _Optional[int] = ...) -> None: ...

class PolicyDecision(_message.Message):
    __slots__ = ("intent_id", "entity_key", "tool_name", "rule", "outcome", "decided_at_ms", "state")
    INTENT_ID_FIELD_NUMBER: _ClassVar[int]
    ENTITY_KEY_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    DECIDED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    intent_id: str
    entity_key: bytes
    tool_name: str
    rule: str
    outcome: str
    decided_at_ms: int
    state: IntentState
    def __init__(self, intent_id: _Optional[str] = ..., entity_key: _Optional[bytes] = ..., tool_name: _Optional[str] = ..., rule: _Optional[str] = ..., outcome: _Optional[str] = ..., decided_at_ms: _Optional[int] = ..., state: _Optional[_Union[IntentState, str]] = ...) -> None: ...

class PoliciesResponse(_message.Message):
    __slots__ = ("enforced", "source", "digest", "loaded_at_ms", "default_outcome", "rules", "counters", "reload_error", "recent")
    ENFORCED_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    LOADED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_OUTCOME_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    RELOAD_ERROR_FIELD_NUMBER: _ClassVar[int]
    RECENT_FIELD_NUMBER: _ClassVar[int]
    enforced: bool
    source: str
    digest: str
    loaded_at_ms: int
    default_outcome: str
    rules: _containers.RepeatedCompositeFieldContainer[PolicyRule]
    counters: _containers.RepeatedCompositeFieldContainer[PolicyCounter]
    reload_error: str
    recent: _containers.RepeatedCompositeFieldContainer[PolicyDecision]
    def __init__(self, enforced: _Optional[bool] = ..., source: _Optional[str] = ..., digest: _Optional[str] = ..., loaded_at_ms: _Optional[int] = ..., default_outcome: _Optional[str] = ..., rules: _Optional[_Iterable[_Union[PolicyRule, _Mapping]]] = ..., counters: _Optional[_Iterable[_Union[PolicyCounter, _Mapping]]] = ..., reload_error: _Optional[str] = ..., recent: _Optional[_Iterable[_Union[PolicyDecision, _Mapping]]] = ...) -> None: ...

class LeaseBudgetRequest(_message.Message):
    __slots__ = ("ledger", "window_ms", "cap_tokens", "cap_cost_micros", "want_tokens", "want_cost_micros", "owner", "release_lease_id", "released_spent_tokens", "released_spent_cost_micros", "cap_requests", "want_requests", "released_spent_requests")
    LEDGER_FIELD_NUMBER: _ClassVar[int]
    WINDOW_MS_FIELD_NUMBER: _ClassVar[int]
    CAP_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CAP_COST_MICROS_FIELD_NUMBER: _ClassVar[int]
    WANT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    WANT_COST_MICROS_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    RELEASE_LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    RELEASED_SPENT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RELEASED_SPENT_COST_MICROS_FIELD_NUMBER: _ClassVar[int]
    CAP_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    WANT_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    RELEASED_SPENT_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    ledger: str
    window_ms: int
    cap_tokens: int
    cap_cost_micros: int
    want_tokens: int
    want_cost_micros: int
    owner: str
    release_lease_id: str
    released_spent_tokens: int
    released_spent_cost_micros: int
    cap_requests: int
    want_requests: int
    released_spent_requests: int
    def __init__(self, ledger: _Optional[str] = ..., window_ms: _Optional[int] = ..., cap_tokens: _Optional[int] = ..., cap_cost_micros: _Optional[int] = ..., want_tokens: _Optional[int] = ..., want_cost_micros: _Optional[int] = ..., owner: _Optional[str] = ..., release_lease_id: _Optional[str] = ..., released_spent_tokens: _Optional[int] = ..., released_spent_cost_micros: _Optional[int] = ..., cap_requests: _Optional[int] = ..., want_requests: _Optional[int] = ..., released_spent_requests: _Optional[int] = ...) -> None: ...

class LeaseBudgetResponse(_message.Message):
    __slots__ = ("lease_id", "window_start_ms", "granted_tokens", "granted_cost_micros", "expires_at_ms", "debited_tokens", "debited_cost_micros", "leased_tokens", "leased_cost_micros", "lease_ms", "granted_requests", "debited_requests", "leased_requests")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    WINDOW_START_MS_FIELD_NUMBER: _ClassVar[int]
    GRANTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    GRANTED_COST_MICROS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_MS_FIELD_NUMBER: _ClassVar[int]
    DEBITED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DEBITED_COST_MICROS_FIELD_NUMBER: _ClassVar[int]
    LEASED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LEASED_COST_MICROS_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    GRANTED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    DEBITED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    LEASED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    window_start_ms: int
    granted_tokens: int
    granted_cost_micros: int
    expires_at_ms: int
    debited_tokens: int
    debited_cost_micros: int
    leased_tokens: int
    leased_cost_micros: int
    lease_ms: int
    granted_requests: int
    debited_requests: int
    leased_requests: int
    def __init__(self, lease_id: _Optional[str] = ..., window_start_ms: _Optional[int] = ..., granted_tokens: _Optional[int] = ..., granted_cost_micros: _Optional[int] = ..., expires_at_ms: _Optional[int] = ..., debited_tokens: _Optional[int] = ..., debited_cost_micros: _Optional[int] = ..., leased_tokens: _Optional[int] = ..., leased_cost_micros: _Optional[int] = ..., lease_ms: _Optional[int] = ..., granted_requests: _Optional[int] = ..., debited_requests: _Optional[int] = ..., leased_requests: _Optional[int] = ...) -> None: ...

class BudgetsRequest(_message.Message):
    __slots__ = ("limit",)
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    limit: int
    def __init__(self, limit: _Optional[int] = ...) -> None: ...

class BudgetWindow(_message.Message):
    __slots__ = ("ledger", "window_start_ms", "window_ms", "cap_tokens", "cap_cost_micros", "debited_tokens", "debited_cost_micros", "leased_tokens", "leased_cost_micros", "live_leases", "debits", "cap_requests", "debited_requests", "leased_requests")
    LEDGER_FIELD_NUMBER: _ClassVar[int]
    WINDOW_START_MS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_MS_FIELD_NUMBER: _ClassVar[int]
    CAP_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CAP_COST_MICROS_FIELD_NUMBER: _ClassVar[int]
    DEBITED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DEBITED_COST_MICROS_FIELD_NUMBER: _ClassVar[int]
    LEASED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LEASED_COST_MICROS_FIELD_NUMBER: _ClassVar[int]
    LIVE_LEASES_FIELD_NUMBER: _ClassVar[int]
    DEBITS_FIELD_NUMBER: _ClassVar[int]
    CAP_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    DEBITED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    LEASED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    ledger: str
    window_start_ms: int
    window_ms: int
    cap_tokens: int
    cap_cost_micros: int
    debited_tokens: int
    debited_cost_micros: int
    leased_tokens: int
    leased_cost_micros: int
    live_leases: int
    debits: int
    cap_requests: int
    debited_requests: int
    leased_requests: int
    def __init__(self, ledger: _Optional[str] = ..., window_start_ms: _Optional[int] = ..., window_ms: _Optional[int] = ..., cap_tokens: _Optional[int] = ..., cap_cost_micros: _Optional[int] = ..., debited_tokens: _Optional[int] = ..., debited_cost_micros: _Optional[int] = ..., leased_tokens: _Optional[int] = ..., leased_cost_micros: _Optional[int] = ..., live_leases: _Optional[int] = ..., debits: _Optional[int] = ..., cap_requests: _Optional[int] = ..., debited_requests: _Optional[int] = ..., leased_requests: _Optional[int] = ...) -> None: ...

class BudgetsResponse(_message.Message):
    __slots__ = ("windows",)
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    windows: _containers.RepeatedCompositeFieldContainer[BudgetWindow]
    def __init__(self, windows: _Optional[_Iterable[_Union[BudgetWindow, _Mapping]]] = ...) -> None: ...
