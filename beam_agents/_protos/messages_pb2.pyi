from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Approval(_message.Message):
    __slots__ = ("intent_id", "approved", "approver", "decided_at_ms", "reason", "superseded_by", "args_digest", "edited_args_json", "approvers")
    INTENT_ID_FIELD_NUMBER: _ClassVar[int]
    APPROVED_FIELD_NUMBER: _ClassVar[int]
    APPROVER_FIELD_NUMBER: _ClassVar[int]
    DECIDED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SUPERSEDED_BY_FIELD_NUMBER: _ClassVar[int]
    ARGS_DIGEST_FIELD_NUMBER: _ClassVar[int]
    EDITED_ARGS_JSON_FIELD_NUMBER: _ClassVar[int]
    APPROVERS_FIELD_NUMBER: _ClassVar[int]
    intent_id: str
    approved: bool
    approver: str
    decided_at_ms: int
    reason: str
    superseded_by: str
    args_digest: str
    edited_args_json: str
    approvers: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, intent_id: _Optional[str] = ..., approved: _Optional[bool] = ..., approver: _Optional[str] = ..., decided_at_ms: _Optional[int] = ..., reason: _Optional[str] = ..., superseded_by: _Optional[str] = ..., args_digest: _Optional[str] = ..., edited_args_json: _Optional[str] = ..., approvers: _Optional[_Iterable[str]] = ...) -> None: ...

class ApprovalEdit(_message.Message):
    __slots__ = ("approval_intent_id", "edited_by", "diff_json")
    APPROVAL_INTENT_ID_FIELD_NUMBER: _ClassVar[int]
    EDITED_BY_FIELD_NUMBER: _ClassVar[int]
    DIFF_JSON_FIELD_NUMBER: _ClassVar[int]
    approval_intent_id: str
    edited_by: str
    diff_json: str
    def __init__(self, approval_intent_id: _Optional[str] = ..., edited_by: _Optional[str] = ..., diff_json: _Optional[str] = ...) -> None: ...

class ToolResult(_message.Message):
    __slots__ = ("intent_id", "entity_key", "seq", "status", "payload", "error_message", "completed_at_ms", "attempt", "refused_submission_digest")
    class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATUS_UNSPECIFIED: _ClassVar[ToolResult.Status]
        OK: _ClassVar[ToolResult.Status]
        ERROR: _ClassVar[ToolResult.Status]
        EXPIRED: _ClassVar[ToolResult.Status]
        REJECTED: _ClassVar[ToolResult.Status]
        NOT_NEEDED: _ClassVar[ToolResult.Status]
        WITHDRAWN: _ClassVar[ToolResult.Status]
    STATUS_UNSPECIFIED: ToolResult.Status
    OK: ToolResult.Status
    ERROR: ToolResult.Status
    EXPIRED: ToolResult.Status
    REJECTED: ToolResult.Status
    NOT_NEEDED: ToolResult.Status
    WITHDRAWN: ToolResult.Status
    INTENT_ID_FIELD_NUMBER: _ClassVar[int]
    ENTITY_KEY_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    REFUSED_SUBMISSION_DIGEST_FIELD_NUMBER: _ClassVar[int]
    intent_id: str
    entity_key: bytes
    seq: int
    status: ToolResult.Status
    payload: bytes
    error_message: str
    completed_at_ms: int
    attempt: int
    refused_submission_digest: bytes
    def __init__(self, intent_id: _Optional[str] = ..., entity_key: _Optional[bytes] = ..., seq: _Optional[int] = ..., status: _Optional[_Union[ToolResult.Status, str]] = ..., payload: _Optional[bytes] = ..., error_message: _Optional[str] = ..., completed_at_ms: _Optional[int] = ..., attempt: _Optional[int] = ..., refused_submission_digest: _Optional[bytes] = ...) -> None: ...

class ToolIntent(_message.Message):
    __slots__ = ("intent_id", "entity_key", "seq", "step_index", "tool_name", "args_json", "created_at_ms", "expires_at_ms", "kind", "trace_id", "channel", "edited_from", "required_approvals", "gated_tool", "withdraws_intent_id", "compensates_intent_id", "compensate_tool", "compensate_args_json", "intent_namespace", "policy_gate_for", "policy_rule")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[ToolIntent.Kind]
        TOOL: _ClassVar[ToolIntent.Kind]
        APPROVAL: _ClassVar[ToolIntent.Kind]
        WITHDRAWAL: _ClassVar[ToolIntent.Kind]
        BUDGET_DEBIT: _ClassVar[ToolIntent.Kind]
    KIND_UNSPECIFIED: ToolIntent.Kind
    TOOL: ToolIntent.Kind
    APPROVAL: ToolIntent.Kind
    WITHDRAWAL: ToolIntent.Kind
    BUDGET_DEBIT: ToolIntent.Kind
    INTENT_ID_FIELD_NUMBER: _ClassVar[int]
    ENTITY_KEY_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    STEP_INDEX_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    ARGS_JSON_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_MS_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    EDITED_FROM_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_APPROVALS_FIELD_NUMBER: _ClassVar[int]
    GATED_TOOL_FIELD_NUMBER: _ClassVar[int]
    WITHDRAWS_INTENT_ID_FIELD_NUMBER: _ClassVar[int]
    COMPENSATES_INTENT_ID_FIELD_NUMBER: _ClassVar[int]
    COMPENSATE_TOOL_FIELD_NUMBER: _ClassVar[int]
    COMPENSATE_ARGS_JSON_FIELD_NUMBER: _ClassVar[int]
    INTENT_NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    POLICY_GATE_FOR_FIELD_NUMBER: _ClassVar[int]
    POLICY_RULE_FIELD_NUMBER: _ClassVar[int]
    intent_id: str
    entity_key: bytes
    seq: int
    step_index: int
    tool_name: str
    args_json: str
    created_at_ms: int
    expires_at_ms: int
    kind: ToolIntent.Kind
    trace_id: str
    channel: str
    edited_from: ApprovalEdit
    required_approvals: int
    gated_tool: str
    withdraws_intent_id: str
    compensates_intent_id: str
    compensate_tool: str
    compensate_args_json: str
    intent_namespace: str
    policy_gate_for: str
    policy_rule: str
    def __init__(self, intent_id: _Optional[str] = ..., entity_key: _Optional[bytes] = ..., seq: _Optional[int] = ..., step_index: _Optional[int] = ..., tool_name: _Optional[str] = ..., args_json: _Optional[str] = ..., created_at_ms: _Optional[int] = ..., expires_at_ms: _Optional[int] = ..., kind: _Optional[_Union[ToolIntent.Kind, str]] = ..., trace_id: _Optional[str] = ..., channel: _Optional[str] = ..., edited_from: _Optional[_Union[ApprovalEdit, _Mapping]] = ..., required_approvals: _Optional[int] = ..., gated_tool: _Optional[str] = ..., withdraws_intent_id: _Optional[str] = ..., compensates_intent_id: _Optional[str] = ..., compensate_tool: _Optional[str] = ..., compensate_args_json: _Optional[str] = ..., intent_namespace: _Optional[str] = ..., policy_gate_for: _Optional[str] = ..., policy_rule: _Optional[str] = ...) -> None: ...

class TraceEvent(_message.Message):
    __slots__ = ("trace_id", "span_id", "parent_span_id", "entity_key", "seq", "step_index", "event_type", "attributes", "start_ms", "end_ms", "sequence", "wall_start_unix_nano", "wall_end_unix_nano")
    class EventType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        EVENT_TYPE_UNSPECIFIED: _ClassVar[TraceEvent.EventType]
        ACTIVATION_START: _ClassVar[TraceEvent.EventType]
        LLM_CALL: _ClassVar[TraceEvent.EventType]
        TOOL_CALL: _ClassVar[TraceEvent.EventType]
        INTENT_EMITTED: _ClassVar[TraceEvent.EventType]
        SUSPENDED: _ClassVar[TraceEvent.EventType]
        ACTIVATION_END: _ClassVar[TraceEvent.EventType]
        ERROR: _ClassVar[TraceEvent.EventType]
    EVENT_TYPE_UNSPECIFIED: TraceEvent.EventType
    ACTIVATION_START: TraceEvent.EventType
    LLM_CALL: TraceEvent.EventType
    TOOL_CALL: TraceEvent.EventType
    INTENT_EMITTED: TraceEvent.EventType
    SUSPENDED: TraceEvent.EventType
    ACTIVATION_END: TraceEvent.EventType
    ERROR: TraceEvent.EventType
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    SPAN_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_SPAN_ID_FIELD_NUMBER: _ClassVar[int]
    ENTITY_KEY_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    STEP_INDEX_FIELD_NUMBER: _ClassVar[int]
    EVENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    START_MS_FIELD_NUMBER: _ClassVar[int]
    END_MS_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    WALL_START_UNIX_NANO_FIELD_NUMBER: _ClassVar[int]
    WALL_END_UNIX_NANO_FIELD_NUMBER: _ClassVar[int]
    trace_id: str
    span_id: str
    parent_span_id: str
    entity_key: bytes
    seq: int
    step_index: int
    event_type: TraceEvent.EventType
    attributes: _containers.ScalarMap[str, str]
    start_ms: int
    end_ms: int
    sequence: int
    wall_start_unix_nano: int
    wall_end_unix_nano: int
    def __init__(self, trace_id: _Optional[str] = ..., span_id: _Optional[str] = ..., parent_span_id: _Optional[str] = ..., entity_key: _Optional[bytes] = ..., seq: _Optional[int] = ..., step_index: _Optional[int] = ..., event_type: _Optional[_Union[TraceEvent.EventType, str]] = ..., attributes: _Optional[_Mapping[str, str]] = ..., start_ms: _Optional[int] = ..., end_ms: _Optional[int] = ..., sequence: _Optional[int] = ..., wall_start_unix_nano: _Optional[int] = ..., wall_end_unix_nano: _Optional[int] = ...) -> None: ...

class AgentEnvelope(_message.Message):
    __slots__ = ("entity_key", "event_time_ms", "external_event", "tool_result", "approval")
    ENTITY_KEY_FIELD_NUMBER: _ClassVar[int]
    EVENT_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    EXTERNAL_EVENT_FIELD_NUMBER: _ClassVar[int]
    TOOL_RESULT_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_FIELD_NUMBER: _ClassVar[int]
    entity_key: bytes
    event_time_ms: int
    external_event: bytes
    tool_result: ToolResult
    approval: Approval
    def __init__(self, entity_key: _Optional[bytes] = ..., event_time_ms: _Optional[int] = ..., external_event: _Optional[bytes] = ..., tool_result: _Optional[_Union[ToolResult, _Mapping]] = ..., approval: _Optional[_Union[Approval, _Mapping]] = ...) -> None: ...

class AgentError(_message.Message):
    __slots__ = ("entity_key", "reason", "detail", "event_time_ms", "envelope", "seq", "traceback", "trace_id")
    ENTITY_KEY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    EVENT_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    ENVELOPE_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TRACEBACK_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    entity_key: bytes
    reason: str
    detail: str
    event_time_ms: int
    envelope: bytes
    seq: int
    traceback: str
    trace_id: str
    def __init__(self, entity_key: _Optional[bytes] = ..., reason: _Optional[str] = ..., detail: _Optional[str] = ..., event_time_ms: _Optional[int] = ..., envelope: _Optional[bytes] = ..., seq: _Optional[int] = ..., traceback: _Optional[str] = ..., trace_id: _Optional[str] = ...) -> None: ...

class IntentDeadLetter(_message.Message):
    __slots__ = ("intent", "reason", "outcome")
    INTENT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    intent: ToolIntent
    reason: str
    outcome: str
    def __init__(self, intent: _Optional[_Union[ToolIntent, _Mapping]] = ..., reason: _Optional[str] = ..., outcome: _Optional[str] = ...) -> None: ...
