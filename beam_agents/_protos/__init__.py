"""The wire contract: protobuf messages, gRPC stubs and the canonical encodings both sides share.

The ``*_pb2`` modules beside this file are generated from ``protos/`` by ``make proto``; import
messages from here, not from them.
"""

import functools
import hashlib
import json
import uuid
from collections.abc import Mapping
from typing import Any

from beam_agents._protos.bounds import (
    MAX_ARGS_JSON_BYTES,
    MAX_ATTRIBUTE_NAME_CHARS,
    MAX_ATTRIBUTE_VALUE_BYTES,
    MAX_ATTRIBUTES,
    MAX_ENTITY_KEY_BYTES,
    MAX_ENVELOPE_BYTES,
    MAX_JSON_DEPTH,
    MAX_TEXT_FIELD_CHARS,
    MAX_TIME_MS,
    MIN_TIME_MS,
    TRUNCATED_MARKER,
    attribute_value_problem,
    bounded_attribute_name,
    bounded_attribute_value,
    bounds_problem,
    entity_key_problem,
    is_json_shaped,
    json_depth,
    json_depth_problem,
    json_problem,
    recordable_problem,
    text_problem,
    time_problem,
)
from beam_agents._protos.effector_pb2 import (
    BudgetsRequest,
    BudgetsResponse,
    BudgetWindow,
    DecideRequest,
    DecideResponse,
    EnvelopeRecord,
    GetIntentRequest,
    GetIntentResponse,
    IntentState,
    LeaseBudgetRequest,
    LeaseBudgetResponse,
    ListIntentsRequest,
    ListIntentsResponse,
    ListRecordsRequest,
    ListRecordsResponse,
    PoliciesRequest,
    PoliciesResponse,
    PolicyCounter,
    PolicyDecision,
    PolicyRule,
    PublishRequest,
    PublishResponse,
    ReadRequest,
    ReadResponse,
    RecordActivationsRequest,
    RecordActivationsResponse,
    RecordErrorsRequest,
    RecordErrorsResponse,
    RecordPlace,
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


def edit_diff(original: Mapping[str, Any], edited: Mapping[str, Any]) -> str:
    """The canonical JSON of an edit's ``added``, ``changed`` and ``removed`` arguments."""
    added = {name: value for name, value in edited.items() if name not in original}
    removed = {name: value for name, value in original.items() if name not in edited}
    changed = {
        name: {"from": original[name], "to": value}
        for name, value in edited.items()
        if name in original and canonical_json(original[name]) != canonical_json(value)
    }
    parts = {"added": added, "changed": changed, "removed": removed}
    return canonical_json({part: names for part, names in parts.items() if names})


def approval_digest(args_json: str) -> str:
    """The digest an approval decision carries: which arguments it was made on (64 hex digits).

    It equals the digest the run records for the approval's step, so the runtime checks a
    decision against its own record, and the effector refuses a ``Decide`` carrying another.
    """
    return hashlib.sha256(f"2|approval|{args_json}".encode()).hexdigest()


_WITHDRAWAL_NAMESPACE = uuid.UUID("7c15948c-8da8-45a7-ba0a-4fa0a876e622")


def submission_digest(intent: ToolIntent) -> bytes:
    """SHA-256 of an intent's deterministic serialization: which submission a refusal answers."""
    return hashlib.sha256(intent.SerializeToString(deterministic=True)).digest()


@functools.cache
def _namespace_hash(namespace: uuid.UUID) -> Any:
    # The SHA-1 state after the namespace bytes: copying it skips rehashing them on every call.
    return hashlib.sha1(namespace.bytes)


def uuid5_hex(namespace: uuid.UUID, name: str) -> str:
    """``uuid.uuid5(namespace, name).hex``: 32 lowercase hex digits."""
    hasher = _namespace_hash(namespace).copy()
    hasher.update(name.encode("utf-8"))
    digest = bytearray(hasher.digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50  # version 5
    digest[8] = (digest[8] & 0x3F) | 0x80  # RFC 4122 variant
    return digest.hex()


def hyphenated(hex32: str) -> str:
    """The canonical 8-4-4-4-12 string form of a 32-digit UUID hex."""
    return f"{hex32[:8]}-{hex32[8:12]}-{hex32[12:16]}-{hex32[16:20]}-{hex32[20:]}"


def withdrawal_id_for(intent_id: str) -> str:
    """The id of the WITHDRAWAL intent that withdraws ``intent_id``: a pure function of it."""
    return str(uuid.uuid5(_WITHDRAWAL_NAMESPACE, intent_id))


_DEBIT_NAMESPACE = uuid.UUID("c8d1f0a2-6b43-4e57-9a0e-2f4b8d7c1e65")


def debit_id_for(
    entity_key: bytes, seq: int, step_index: int, ledger: str, namespace: str | None = None
) -> str:
    """The id of the BUDGET_DEBIT of the model call at a run's step, for one budget ledger.

    ``uuid5`` of the position and the ledger: a retried or replayed call mints the same id.
    """
    position = f"{namespace or ''}|{entity_key.hex()}|{seq}|{step_index}|{ledger}"
    return hyphenated(uuid5_hex(_DEBIT_NAMESPACE, position))


__all__ = [
    "MAX_ARGS_JSON_BYTES",
    "MAX_ATTRIBUTES",
    "MAX_ATTRIBUTE_NAME_CHARS",
    "MAX_ATTRIBUTE_VALUE_BYTES",
    "MAX_ENTITY_KEY_BYTES",
    "MAX_ENVELOPE_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_TEXT_FIELD_CHARS",
    "MAX_TIME_MS",
    "MIN_TIME_MS",
    "TRUNCATED_MARKER",
    "ActivationRecord",
    "AgentEnvelope",
    "AgentError",
    "Approval",
    "ApprovalEdit",
    "BudgetWindow",
    "BudgetsRequest",
    "BudgetsResponse",
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
    "LeaseBudgetRequest",
    "LeaseBudgetResponse",
    "ListIntentsRequest",
    "ListIntentsResponse",
    "ListRecordsRequest",
    "ListRecordsResponse",
    "MemorySlot",
    "MemoryState",
    "ModelCache",
    "ModelCacheEntry",
    "PoliciesRequest",
    "PoliciesResponse",
    "PolicyCounter",
    "PolicyDecision",
    "PolicyRule",
    "PublishRequest",
    "PublishResponse",
    "ReadRequest",
    "ReadResponse",
    "RecordActivationsRequest",
    "RecordActivationsResponse",
    "RecordErrorsRequest",
    "RecordErrorsResponse",
    "RecordPlace",
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
    "attribute_value_problem",
    "bounded_attribute_name",
    "bounded_attribute_value",
    "bounds_problem",
    "canonical_json",
    "canonical_json_bytes",
    "debit_id_for",
    "edit_diff",
    "entity_key_problem",
    "hyphenated",
    "is_json_shaped",
    "json_depth",
    "json_depth_problem",
    "json_problem",
    "recordable_problem",
    "submission_digest",
    "text_problem",
    "time_problem",
    "uuid5_hex",
    "withdrawal_id_for",
]
