"""What any message may carry: the times, sizes, depths and text lengths every reader handles.

The effector checks what a client sends against these bounds (invariant 9), and the pipeline
checks each intent it stages against the same ones, so an intent the effector would refuse
unrecorded fails its activation instead.
"""

import re
from collections.abc import Iterable
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from beam_agents._protos.messages_pb2 import ToolIntent

MAX_ENTITY_KEY_BYTES = 4_096
"""The longest entity key any message may carry."""
MAX_TEXT_FIELD_CHARS = 4_096
"""The longest plain text field (a tool name, an approver, a reason) a message may carry."""
MAX_ENVELOPE_BYTES = 4 * 1024 * 1024
"""The largest envelope Publish appends: two always fit in one Read answer."""
MAX_ARGS_JSON_BYTES = 1024 * 1024
"""The largest JSON an intent or a decision may carry in one field (arguments, edits)."""
MIN_TIME_MS = -62_135_596_800_000
"""0001-01-01T00:00:00Z: the earliest time any message may carry (ms since the epoch)."""
MAX_TIME_MS = 253_402_300_799_999
"""9999-12-31T23:59:59.999Z: the latest time any message may carry, so every reader can show it."""
MAX_BUDGET_AMOUNT = 2**53
"""The largest amount of tokens, micro-dollars or requests a budget's cap, lease or debit
carries."""
MAX_LEDGER_CHARS = 512
"""The longest budget ledger name; it is printable text."""
MAX_WINDOW_MS = 366 * 86_400_000
"""The longest window a budget or a policy counter may have: 366 days."""
_DURATION = re.compile(r"(\d{1,12})(ms|s|m|h|d)\Z")
_DURATION_UNITS_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def window_ms(text: object) -> int | None:
    """A window written ``"500ms"``, ``"90s"``, ``"15m"``, ``"24h"`` or ``"7d"``, in ms.

    ``None`` unless it is one of those, from 1 ms to :data:`MAX_WINDOW_MS`.
    """
    match = _DURATION.match(text) if isinstance(text, str) else None
    if match is None:
        return None
    length = int(match[1]) * _DURATION_UNITS_MS[match[2]]
    return length if 0 < length <= MAX_WINDOW_MS else None


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


def entity_key_problem(entity_key: bytes) -> str | None:
    if not entity_key:
        return "has an empty entity_key"
    if len(entity_key) > MAX_ENTITY_KEY_BYTES:
        return f"has an entity_key of {len(entity_key)} bytes (at most {MAX_ENTITY_KEY_BYTES})"
    return None


def json_problem(name: str, text: str, max_bytes: int = MAX_ARGS_JSON_BYTES) -> str | None:
    """Why the JSON text of field ``name`` is too large or nests too deeply, or ``None``."""
    if len(text) * 4 > max_bytes and (size := len(text.encode("utf-8"))) > max_bytes:
        return f"has {name} of {size} bytes (at most {max_bytes})"
    problem = json_depth_problem(name, text)
    return None if problem is None else f"has JSON nested too deeply: {problem}"


_INT64 = FieldDescriptor.TYPE_INT64
_STRING = FieldDescriptor.TYPE_STRING
_MESSAGE = FieldDescriptor.TYPE_MESSAGE


def bounds_problem(message: Message, max_json_bytes: int = MAX_ARGS_JSON_BYTES) -> str | None:
    """Why a message holds a time, wall-clock nanos or JSON out of bounds, or ``None``.

    Walks every nested message without recursion: each ``*_ms`` field is a time (years 1-9999),
    each ``*_unix_nano`` is 0 or later than the epoch, each ``*_json`` is JSON of at most
    ``max_json_bytes`` nested at most ``MAX_JSON_DEPTH`` deep.
    """
    stack: list[tuple[Message, str]] = [(message, "")]
    while stack:
        current, path = stack.pop()
        for described, value in current.ListFields():
            name = path + described.name
            if described.type == _MESSAGE:
                stack.extend((child, f"{name}.") for child in _submessages(described, value))
                continue
            values = value if described.is_repeated else [value]
            problem = _field_problem(described, name, values, max_json_bytes)
            if problem is not None:
                return problem
    return None


def _submessages(described: FieldDescriptor, value: Any) -> list[Message]:
    """The messages a message-typed field holds (a map's values, if they are messages)."""
    entry = described.message_type
    if entry is not None and entry.GetOptions().map_entry:
        holds_messages = entry.fields_by_name["value"].type == _MESSAGE
        return list(value.values()) if holds_messages else []
    return list(value) if described.is_repeated else [value]


def _field_problem(
    described: FieldDescriptor, name: str, values: Iterable[Any], max_json_bytes: int
) -> str | None:
    for value in values:
        if described.type == _INT64 and described.name.endswith("_ms"):
            problem = time_problem(name, value)
            if problem is not None:
                return f"has a time out of range: {problem}"
        elif described.type == _INT64 and described.name.endswith("_unix_nano") and value < 0:
            return f"has {name} {value}: wall-clock nanos are 0 (not measured) or after 1970"
        elif described.type == _STRING and described.name.endswith("_json"):
            problem = json_problem(name, value, max_json_bytes)
            if problem is not None:
                return problem
    return None


def text_problem(message: Message, allowed: Iterable[str] = ()) -> str | None:
    """Why a plain text field of ``message`` (not JSON) is over ``MAX_TEXT_FIELD_CHARS``."""
    for described, value in message.ListFields():
        plain = not (described.name.endswith("_json") or described.name in allowed)
        text = described.type == _STRING and not described.is_repeated
        if plain and text and len(value) > MAX_TEXT_FIELD_CHARS:
            return (
                f"has a {described.name} of {len(value)} characters "
                f"(at most {MAX_TEXT_FIELD_CHARS})"
            )
    return None


def recordable_problem(intent: ToolIntent) -> str | None:
    """Why the effector could not record ``intent`` (key, text, times, JSON), or ``None``."""
    if _plainly_recordable(intent):
        return None
    return walked_recordable_problem(intent)


def walked_recordable_problem(intent: ToolIntent) -> str | None:
    """:func:`recordable_problem` by walking every field, without the quick look."""
    return (
        entity_key_problem(intent.entity_key)
        or text_problem(intent)
        or text_problem(intent.edited_from)
        or bounds_problem(intent)
    )


_INTENT_FIELDS = ToolIntent.DESCRIPTOR.fields
_INTENT_TIMES = tuple(
    f.name for f in _INTENT_FIELDS if f.cpp_type == f.CPPTYPE_INT64 and f.name.endswith("_ms")
)
_INTENT_NANOS = tuple(f.name for f in _INTENT_FIELDS if f.name.endswith("_unix_nano"))
_INTENT_JSON = tuple(f.name for f in _INTENT_FIELDS if f.name.endswith("_json"))
_INTENT_MESSAGES = tuple(f.name for f in _INTENT_FIELDS if f.message_type is not None)


def _plainly_recordable(intent: ToolIntent) -> bool:
    """Whether the full walk certainly finds nothing: the usual intent, checked fast.

    Small (no text field can be over its limit in fewer bytes) and without nested messages, it
    needs only its key, its times and its JSON's bracket counts looked at; any other intent
    gets the full walk.
    """
    if intent.ByteSize() > MAX_TEXT_FIELD_CHARS or not intent.entity_key:
        return False
    if any(intent.HasField(name) for name in _INTENT_MESSAGES):
        return False
    for name in _INTENT_TIMES:
        if not MIN_TIME_MS <= getattr(intent, name) <= MAX_TIME_MS:
            return False
    for name in _INTENT_NANOS:
        if getattr(intent, name) < 0:
            return False
    for name in _INTENT_JSON:
        text = getattr(intent, name)
        if text.count("[") + text.count("{") > MAX_JSON_DEPTH:
            return False
    return True
