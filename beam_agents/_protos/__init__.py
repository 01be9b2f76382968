"""The wire contract: protobuf messages, gRPC stubs and the canonical encodings both sides share.

The ``*_pb2`` modules beside this file are generated from ``protos/`` by ``make proto``; import
messages from here, not from them.
"""

import hashlib
import json
import uuid
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


def approval_digest(args_json: str) -> str:
    """The digest an approval decision carries: which arguments it was made on (64 hex digits).

    It equals the digest the run records for the approval's step, so the runtime checks a
    decision against its own record, and the effector refuses a ``Decide`` carrying another.
    """
    return hashlib.sha256(f"2|approval|{args_json}".encode()).hexdigest()


MIN_TIME_MS = -62_135_596_800_000
"""0001-01-01T00:00:00Z: the earliest time any message may carry (ms since the epoch)."""
MAX_TIME_MS = 253_402_300_799_999
"""9999-12-31T23:59:59.999Z: the latest time any message may carry, so every reader can show it."""
MAX_JSON_DEPTH = 64
"""How deeply JSON a client sends (arguments, attributes) may nest."""
MAX_ATTRIBUTES = 256
"""The most attributes one trace event may carry."""
MAX_ATTRIBUTE_NAME_CHARS = 256
"""The longest name a trace event's attribute may have, in characters."""
MAX_ATTRIBUTE_VALUE_BYTES = 64 * 1024
"""The largest value a trace event's attribute may have, in UTF-8 bytes."""
TRUNCATED_MARKER = " … (truncated)"
"""What ends an attribute value cut to fit: it does not end in a bracket, so it is not JSON."""
_JSON_WHITESPACE = " \t\n\r"
_WITHDRAWAL_NAMESPACE = uuid.UUID("7c15948c-8da8-45a7-ba0a-4fa0a876e622")


def time_problem(name: str, value_ms: int) -> str | None:
    """Why ``value_ms`` is outside the times messages may carry, or ``None``."""
    if MIN_TIME_MS <= value_ms <= MAX_TIME_MS:
        return None
    return f"{name} {value_ms} is outside years 1-9999 ({MIN_TIME_MS} to {MAX_TIME_MS} ms)"


def json_depth(text: str) -> int:
    """How deeply the arrays and objects of JSON ``text`` nest (0 for a scalar)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def json_depth_problem(name: str, text: str) -> str | None:
    """Why JSON ``text`` nests too deeply to accept, or ``None``."""
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH or json_depth(text) <= MAX_JSON_DEPTH:
        return None
    return f"{name} nests deeper than {MAX_JSON_DEPTH} levels"


def is_json_shaped(text: str) -> bool:
    """Whether ``text`` is JSON-shaped: the only attribute values whose depth is checked.

    JSON-shaped means that, without surrounding JSON whitespace, it starts with ``[`` or ``{``
    and ends with ``]`` or ``}``. Any other value is plain text, whatever brackets it holds.
    """
    stripped = text.strip(_JSON_WHITESPACE)
    return bool(stripped) and stripped[0] in "[{" and stripped[-1] in "]}"


def attribute_value_problem(name: str, value: str) -> str | None:
    """Why an attribute value is over the limits (size; depth if JSON-shaped), or ``None``."""
    if len(value) > MAX_ATTRIBUTE_VALUE_BYTES // 4:  # four UTF-8 bytes a character at most
        size = len(value.encode("utf-8", "surrogatepass"))
        if size > MAX_ATTRIBUTE_VALUE_BYTES:
            return f"{name} of {size} bytes (at most {MAX_ATTRIBUTE_VALUE_BYTES})"
    if is_json_shaped(value) and (problem := json_depth_problem(name, value)) is not None:
        return f"JSON nested too deeply: {problem}"
    return None


def bounded_attribute_value(value: str) -> str:
    """``value`` within the attribute limits: cut at a character boundary, marked, if it is not.

    A value cut for size, or JSON-shaped and too deep, ends with :data:`TRUNCATED_MARKER`.
    """
    if len(value) <= MAX_ATTRIBUTE_VALUE_BYTES // 4 and (
        value.count("[") + value.count("{") <= MAX_JSON_DEPTH
    ):
        return value  # the common case: a length check and two counts
    if attribute_value_problem("", value) is None:
        return value
    room = MAX_ATTRIBUTE_VALUE_BYTES - len(TRUNCATED_MARKER.encode("utf-8"))
    kept = value.encode("utf-8", "surrogatepass")[:room].decode("utf-8", "ignore")
    return kept + TRUNCATED_MARKER


def bounded_attribute_name(name: str) -> str:
    """``name`` cut to :data:`MAX_ATTRIBUTE_NAME_CHARS` characters, ending in "…" if cut."""
    if len(name) <= MAX_ATTRIBUTE_NAME_CHARS:
        return name
    return name[: MAX_ATTRIBUTE_NAME_CHARS - 1] + "…"


def submission_digest(intent: ToolIntent) -> bytes:
    """SHA-256 of an intent's deterministic serialization: which submission a refusal answers."""
    return hashlib.sha256(intent.SerializeToString(deterministic=True)).digest()


def withdrawal_id_for(intent_id: str) -> str:
    """The id of the WITHDRAWAL intent that withdraws ``intent_id``: a pure function of it."""
    return str(uuid.uuid5(_WITHDRAWAL_NAMESPACE, intent_id))


__all__ = [
    "MAX_ATTRIBUTES",
    "MAX_ATTRIBUTE_NAME_CHARS",
    "MAX_ATTRIBUTE_VALUE_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_TIME_MS",
    "MIN_TIME_MS",
    "TRUNCATED_MARKER",
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
    "canonical_json",
    "canonical_json_bytes",
    "is_json_shaped",
    "json_depth",
    "json_depth_problem",
    "submission_digest",
    "time_problem",
    "withdrawal_id_for",
]
