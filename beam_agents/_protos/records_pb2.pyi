from beam_agents._protos import messages_pb2 as _messages_pb2
from beam_agents._protos import state_pb2 as _state_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RecordedModelCall(_message.Message):
    __slots__ = ("step_index", "request_json", "request_digest", "response", "input_tokens", "output_tokens", "model", "position", "decoder")
    STEP_INDEX_FIELD_NUMBER: _ClassVar[int]
    REQUEST_JSON_FIELD_NUMBER: _ClassVar[int]
    REQUEST_DIGEST_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    DECODER_FIELD_NUMBER: _ClassVar[int]
    step_index: int
    request_json: str
    request_digest: str
    response: bytes
    input_tokens: int
    output_tokens: int
    model: str
    position: int
    decoder: str
    def __init__(self, step_index: _Optional[int] = ..., request_json: _Optional[str] = ..., request_digest: _Optional[str] = ..., response: _Optional[bytes] = ..., input_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ..., model: _Optional[str] = ..., position: _Optional[int] = ..., decoder: _Optional[str] = ...) -> None: ...

class RecordedToolCall(_message.Message):
    __slots__ = ("tool_name", "args_json", "result_json", "error_type", "error_message", "position", "unrecorded_result_type")
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    ARGS_JSON_FIELD_NUMBER: _ClassVar[int]
    RESULT_JSON_FIELD_NUMBER: _ClassVar[int]
    ERROR_TYPE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    UNRECORDED_RESULT_TYPE_FIELD_NUMBER: _ClassVar[int]
    tool_name: str
    args_json: str
    result_json: str
    error_type: str
    error_message: str
    position: int
    unrecorded_result_type: str
    def __init__(self, tool_name: _Optional[str] = ..., args_json: _Optional[str] = ..., result_json: _Optional[str] = ..., error_type: _Optional[str] = ..., error_message: _Optional[str] = ..., position: _Optional[int] = ..., unrecorded_result_type: _Optional[str] = ...) -> None: ...

class RecordedSlot(_message.Message):
    __slots__ = ("key", "digest", "size_bytes", "slot")
    KEY_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    key: str
    digest: bytes
    size_bytes: int
    slot: _state_pb2.MemorySlot
    def __init__(self, key: _Optional[str] = ..., digest: _Optional[bytes] = ..., size_bytes: _Optional[int] = ..., slot: _Optional[_Union[_state_pb2.MemorySlot, _Mapping]] = ...) -> None: ...

class RecordedMemory(_message.Message):
    __slots__ = ("known", "slots")
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    known: bool
    slots: _containers.RepeatedCompositeFieldContainer[RecordedSlot]
    def __init__(self, known: _Optional[bool] = ..., slots: _Optional[_Iterable[_Union[RecordedSlot, _Mapping]]] = ...) -> None: ...

class ActivationRecord(_message.Message):
    __slots__ = ("schema_version", "entity_key", "seq", "trigger", "envelope", "first_step", "trace_sequence", "continuation_before", "model_calls", "tool_calls", "intents", "outcome", "output", "snapshot", "memory_before", "memory_after", "intent_namespace")
    class Outcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        OUTCOME_UNSPECIFIED: _ClassVar[ActivationRecord.Outcome]
        COMPLETE: _ClassVar[ActivationRecord.Outcome]
        SUSPEND: _ClassVar[ActivationRecord.Outcome]
    OUTCOME_UNSPECIFIED: ActivationRecord.Outcome
    COMPLETE: ActivationRecord.Outcome
    SUSPEND: ActivationRecord.Outcome
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    ENTITY_KEY_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_FIELD_NUMBER: _ClassVar[int]
    ENVELOPE_FIELD_NUMBER: _ClassVar[int]
    FIRST_STEP_FIELD_NUMBER: _ClassVar[int]
    TRACE_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    CONTINUATION_BEFORE_FIELD_NUMBER: _ClassVar[int]
    MODEL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    INTENTS_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BEFORE_FIELD_NUMBER: _ClassVar[int]
    MEMORY_AFTER_FIELD_NUMBER: _ClassVar[int]
    INTENT_NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    schema_version: int
    entity_key: bytes
    seq: int
    trigger: str
    envelope: _messages_pb2.AgentEnvelope
    first_step: int
    trace_sequence: int
    continuation_before: _state_pb2.Continuation
    model_calls: _containers.RepeatedCompositeFieldContainer[RecordedModelCall]
    tool_calls: _containers.RepeatedCompositeFieldContainer[RecordedToolCall]
    intents: _containers.RepeatedCompositeFieldContainer[_messages_pb2.ToolIntent]
    outcome: ActivationRecord.Outcome
    output: bytes
    snapshot: bytes
    memory_before: RecordedMemory
    memory_after: RecordedMemory
    intent_namespace: str
    def __init__(self, schema_version: _Optional[int] = ..., entity_key: _Optional[bytes] = ..., seq: _Optional[int] = ..., trigger: _Optional[str] = ..., envelope: _Optional[_Union[_messages_pb2.AgentEnvelope, _Mapping]] = ..., first_step: _Optional[int] = ..., trace_sequence: _Optional[int] = ..., continuation_before: _Optional[_Union[_state_pb2.Continuation, _Mapping]] = ..., model_calls: _Optional[_Iterable[_Union[RecordedModelCall, _Mapping]]] = ..., tool_calls: _Optional[_Iterable[_Union[RecordedToolCall, _Mapping]]] = ..., intents: _Optional[_Iterable[_Union[_messages_pb2.ToolIntent, _Mapping]]] = ..., outcome: _Optional[_Union[ActivationRecord.Outcome, str]] = ..., output: _Optional[bytes] = ..., snapshot: _Optional[bytes] = ..., memory_before: _Optional[_Union[RecordedMemory, _Mapping]] = ..., memory_after: _Optional[_Union[RecordedMemory, _Mapping]] = ..., intent_namespace: _Optional[str] = ...) -> None: ...
