"""Generated protobuf messages and gRPC stubs (package ``beam_agents.v1``), re-exported.

The modules beside this file are generated from ``protos/`` by ``make proto`` and committed;
a test fails when regenerating would change them. Import messages from here, not from the
``*_pb2`` modules, so that their layout stays private.
"""

from beam_agents._protos.effector_pb2 import (
    DecideRequest,
    DecideResponse,
    EnvelopeRecord,
    GetIntentRequest,
    GetIntentResponse,
    IntentState,
    ListIntentsRequest,
    ListIntentsResponse,
    PublishRequest,
    PublishResponse,
    ReadRequest,
    ReadResponse,
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
    IntentDeadLetter,
    ToolIntent,
    ToolResult,
    TraceEvent,
)
from beam_agents._protos.state_pb2 import (
    Continuation,
    KeyHeader,
    MemorySlot,
    MemoryState,
    ModelCache,
    ModelCacheEntry,
    RingItems,
)

__all__ = [
    "AgentEnvelope",
    "AgentError",
    "Approval",
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
    "MemorySlot",
    "MemoryState",
    "ModelCache",
    "ModelCacheEntry",
    "PublishRequest",
    "PublishResponse",
    "ReadRequest",
    "ReadResponse",
    "RecordErrorsRequest",
    "RecordErrorsResponse",
    "RecordTracesRequest",
    "RecordTracesResponse",
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
]
