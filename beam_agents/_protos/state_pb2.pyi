from beam_agents._protos import messages_pb2 as _messages_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MemorySlot(_message.Message):
    __slots__ = ("key", "value", "ring")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    RING_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: bytes
    ring: RingItems
    def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ..., ring: _Optional[_Union[RingItems, _Mapping]] = ...) -> None: ...

class RingItems(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, items: _Optional[_Iterable[bytes]] = ...) -> None: ...

class MemoryState(_message.Message):
    __slots__ = ("schema_version", "slots")
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    schema_version: int
    slots: _containers.RepeatedCompositeFieldContainer[MemorySlot]
    def __init__(self, schema_version: _Optional[int] = ..., slots: _Optional[_Iterable[_Union[MemorySlot, _Mapping]]] = ...) -> None: ...

class ModelCacheEntry(_message.Message):
    __slots__ = ("cache_key", "seq", "step_index", "response", "input_tokens", "output_tokens", "stored_at_ms")
    CACHE_KEY_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    STEP_INDEX_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STORED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    cache_key: str
    seq: int
    step_index: int
    response: bytes
    input_tokens: int
    output_tokens: int
    stored_at_ms: int
    def __init__(self, cache_key: _Optional[str] = ..., seq: _Optional[int] = ..., step_index: _Optional[int] = ..., response: _Optional[bytes] = ..., input_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ..., stored_at_ms: _Optional[int] = ...) -> None: ...

class ModelCache(_message.Message):
    __slots__ = ("schema_version", "entries")
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    schema_version: int
    entries: _containers.RepeatedCompositeFieldContainer[ModelCacheEntry]
    def __init__(self, schema_version: _Optional[int] = ..., entries: _Optional[_Iterable[_Union[ModelCacheEntry, _Mapping]]] = ...) -> None: ...

class Continuation(_message.Message):
    __slots__ = ("schema_version", "seq", "next_step", "snapshot", "adapter", "pending_intent_ids", "deadline_ms", "results", "approvals", "trace_id", "escalations", "started_at_ms", "tokens_used", "pending_kinds", "answered_intent_ids", "trace_sequence", "steps", "intent_namespace", "compensations", "replay_cache", "submission_digests")
    class StepRecord(_message.Message):
        __slots__ = ("kind", "digest")
        class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
            __slots__ = ()
            KIND_UNSPECIFIED: _ClassVar[Continuation.StepRecord.Kind]
            MODEL: _ClassVar[Continuation.StepRecord.Kind]
            INTENT: _ClassVar[Continuation.StepRecord.Kind]
            APPROVAL: _ClassVar[Continuation.StepRecord.Kind]
            ESCALATION: _ClassVar[Continuation.StepRecord.Kind]
        KIND_UNSPECIFIED: Continuation.StepRecord.Kind
        MODEL: Continuation.StepRecord.Kind
        INTENT: Continuation.StepRecord.Kind
        APPROVAL: Continuation.StepRecord.Kind
        ESCALATION: Continuation.StepRecord.Kind
        KIND_FIELD_NUMBER: _ClassVar[int]
        DIGEST_FIELD_NUMBER: _ClassVar[int]
        kind: Continuation.StepRecord.Kind
        digest: bytes
        def __init__(self, kind: _Optional[_Union[Continuation.StepRecord.Kind, str]] = ..., digest: _Optional[bytes] = ...) -> None: ...
    class SubmissionDigestsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    NEXT_STEP_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    PENDING_INTENT_IDS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    APPROVALS_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    ESCALATIONS_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_USED_FIELD_NUMBER: _ClassVar[int]
    PENDING_KINDS_FIELD_NUMBER: _ClassVar[int]
    ANSWERED_INTENT_IDS_FIELD_NUMBER: _ClassVar[int]
    TRACE_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    INTENT_NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    COMPENSATIONS_FIELD_NUMBER: _ClassVar[int]
    REPLAY_CACHE_FIELD_NUMBER: _ClassVar[int]
    SUBMISSION_DIGESTS_FIELD_NUMBER: _ClassVar[int]
    schema_version: int
    seq: int
    next_step: int
    snapshot: bytes
    adapter: str
    pending_intent_ids: _containers.RepeatedScalarFieldContainer[str]
    deadline_ms: int
    results: _containers.RepeatedCompositeFieldContainer[_messages_pb2.ToolResult]
    approvals: _containers.RepeatedCompositeFieldContainer[_messages_pb2.Approval]
    trace_id: str
    escalations: int
    started_at_ms: int
    tokens_used: int
    pending_kinds: _containers.RepeatedScalarFieldContainer[_messages_pb2.ToolIntent.Kind]
    answered_intent_ids: _containers.RepeatedScalarFieldContainer[str]
    trace_sequence: int
    steps: _containers.RepeatedCompositeFieldContainer[Continuation.StepRecord]
    intent_namespace: str
    compensations: _containers.RepeatedCompositeFieldContainer[CompensationLink]
    replay_cache: bytes
    submission_digests: _containers.ScalarMap[str, bytes]
    def __init__(self, schema_version: _Optional[int] = ..., seq: _Optional[int] = ..., next_step: _Optional[int] = ..., snapshot: _Optional[bytes] = ..., adapter: _Optional[str] = ..., pending_intent_ids: _Optional[_Iterable[str]] = ..., deadline_ms: _Optional[int] = ..., results: _Optional[_Iterable[_Union[_messages_pb2.ToolResult, _Mapping]]] = ..., approvals: _Optional[_Iterable[_Union[_messages_pb2.Approval, _Mapping]]] = ..., trace_id: _Optional[str] = ..., escalations: _Optional[int] = ..., started_at_ms: _Optional[int] = ..., tokens_used: _Optional[int] = ..., pending_kinds: _Optional[_Iterable[_Union[_messages_pb2.ToolIntent.Kind, str]]] = ..., answered_intent_ids: _Optional[_Iterable[str]] = ..., trace_sequence: _Optional[int] = ..., steps: _Optional[_Iterable[_Union[Continuation.StepRecord, _Mapping]]] = ..., intent_namespace: _Optional[str] = ..., compensations: _Optional[_Iterable[_Union[CompensationLink, _Mapping]]] = ..., replay_cache: _Optional[bytes] = ..., submission_digests: _Optional[_Mapping[str, bytes]] = ...) -> None: ...

class CompensationLink(_message.Message):
    __slots__ = ("intent_id", "step_index", "tool_name", "args_json", "compensation_intent_id")
    INTENT_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_INDEX_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    ARGS_JSON_FIELD_NUMBER: _ClassVar[int]
    COMPENSATION_INTENT_ID_FIELD_NUMBER: _ClassVar[int]
    intent_id: str
    step_index: int
    tool_name: str
    args_json: str
    compensation_intent_id: str
    def __init__(self, intent_id: _Optional[str] = ..., step_index: _Optional[int] = ..., tool_name: _Optional[str] = ..., args_json: _Optional[str] = ..., compensation_intent_id: _Optional[str] = ...) -> None: ...

class KeyHeader(_message.Message):
    __slots__ = ("schema_version", "next_seq", "last_activity_ms", "continuation")
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    NEXT_SEQ_FIELD_NUMBER: _ClassVar[int]
    LAST_ACTIVITY_MS_FIELD_NUMBER: _ClassVar[int]
    CONTINUATION_FIELD_NUMBER: _ClassVar[int]
    schema_version: int
    next_seq: int
    last_activity_ms: int
    continuation: bytes
    def __init__(self, schema_version: _Optional[int] = ..., next_seq: _Optional[int] = ..., last_activity_ms: _Optional[int] = ..., continuation: _Optional[bytes] = ...) -> None: ...
