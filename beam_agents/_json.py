"""Canonical JSON: the one encoding used for intent arguments and tool result payloads.

Sorted keys, compact separators, UTF-8 kept as is, and no NaN or infinity (they are not JSON),
so equal values always encode to equal bytes on both sides of the pipeline/effector boundary.
"""

from __future__ import annotations

import json
from typing import Any

# Built once: ``json.dumps`` with any non-default option builds a new encoder on every call.
_ENCODER = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)


def canonical_json(value: Any) -> str:
    """Encode ``value`` as canonical JSON text; raises ``TypeError``/``ValueError`` if it cannot."""
    return _ENCODER.encode(value)


def canonical_json_bytes(value: Any) -> bytes:
    """Encode ``value`` as canonical JSON, UTF-8 bytes."""
    return canonical_json(value).encode("utf-8")
