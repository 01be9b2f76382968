"""The wire contract: protobuf messages, gRPC stubs and the canonical encodings both sides share.

The ``*_pb2`` modules beside this file are generated from ``protos/`` by ``make proto``; import
messages from here, not from them.
"""

import hashlib
import json
from typing import Any

from beam_agents._protos.effector_pb2 import (
    DecideRequest,
    DecideResponse,
    EnvelopeRecord,
    GetIntentRequest,
    GetIntentResponse,
    IntentState,
    ListIntentsRequest,
    ListIntentsResponse,
    ListRecordsRequest,
    ListRecordsResponse,
    PublishRequest,
    PublishResponse,
    ReadRequest,
    ReadResponse,
    RecordActivationsRequest,
    RecordActivationsResponse,
    RecordErrorsRequest,
    RecordErrorsResponse,
    RecordTracesRequest,
    RecordTracesResponse,
    StatusRequest,
    StatusResponse,
    SubmitAck,
    SubmitRequest,
    SubmitResponse,
)
from beam_agents._protos.effector_pb2_grpc import (
    EffectorServicer,
    EffectorStub,
    add_EffectorServicer_to_server,
)
from beam_agents._protos.messages_pb2 import (
    AgentEnvelope,
    AgentError,
    Approval,
    ApprovalEdit,
    IntentDeadLetter,
    ToolIntent,
    ToolResult,
    TraceEvent,
)
from beam_agents._protos.records_pb2 import (
    ActivationRecord,
    RecordedMemory,
    RecordedModelCall,
    RecordedSlot,
    RecordedToolCall,
)
from beam_agents._protos.state_pb2 import (
    CompensationLink,
    Continuation,
    KeyHeader,
    MemorySlot,
    MemoryState,
    ModelCache,
    ModelCacheEntry,
    RingItems,
)

# Built once: ``json.dumps`` with any non-default option builds a new encoder on every call.
_ENCODER = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)


def canonical_json(value: Any) -> str:
    """Encode ``value`` as canonical JSON text: sorted keys, compact, UTF-8 as is, no NaN.

    Raises ``TypeError`` or ``ValueError`` for a value JSON cannot hold.
    """
    return _ENCODER.encode(value)


def canonical_json_bytes(value: Any) -> bytes:
    """Encode ``value`` as canonical JSON, UTF-8 bytes."""
    return canonical_json(value).encode("utf-8")


def approval_digest(args_json: str) -> str:
    """The digest an approval decision carries: which arguments it was made on (64 hex digits).

    It equals the digest the run records for the approval's step, so the runtime checks a
    decision against its own record, and the effector refuses a ``Decide`` carrying another.
    """
    return hashlib.sha256(f"2|approval|{args_json}".encode()).hexdigest()


__all__ = [
    "ActivationRecord",
    "AgentEnvelope",
    "AgentError",
    "Approval",
    "ApprovalEdit",
    "CompensationLink",
    "Continuation",
    "DecideRequest",
    "DecideResponse",
    "EffectorServicer",
    "EffectorStub",
    "EnvelopeRecord",
    "GetIntentRequest",
    "GetIntentResponse",
    "IntentDeadLetter",
    "IntentState",
    "KeyHeader",
    "ListIntentsRequest",
    "ListIntentsResponse",
    "ListRecordsRequest",
    "ListRecordsResponse",
    "MemorySlot",
    "MemoryState",
    "ModelCache",
    "ModelCacheEntry",
    "PublishRequest",
    "PublishResponse",
    "ReadRequest",
    "ReadResponse",
    "RecordActivationsRequest",
    "RecordActivationsResponse",
    "RecordErrorsRequest",
    "RecordErrorsResponse",
    "RecordTracesRequest",
    "RecordTracesResponse",
    "RecordedMemory",
    "RecordedModelCall",
    "RecordedSlot",
    "RecordedToolCall",
    "RingItems",
    "StatusRequest",
    "StatusResponse",
    "SubmitAck",
    "SubmitRequest",
    "SubmitResponse",
    "ToolIntent",
    "ToolResult",
    "TraceEvent",
    "add_EffectorServicer_to_server",
    "approval_digest",
    "canonical_json",
    "canonical_json_bytes",
]
