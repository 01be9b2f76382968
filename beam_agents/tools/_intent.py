"""``IntentInfo``: the identity of the intent a side-effecting tool is executing for.

The effector injects it into a tool that declares ``*, intent: IntentInfo``, so the tool can
pass ``intent_id`` downstream as an idempotency key (see ``beam_agents/tools/README.md``).
"""

from __future__ import annotations

from dataclasses import dataclass

INTENT_PARAMETER = "intent"
"""The one parameter name under which a side-effecting tool may receive its ``IntentInfo``."""


@dataclass(frozen=True, slots=True)
class IntentInfo:
    """Which intent a side-effecting tool is executing for; the effector injects it.

    A side-effecting tool that declares a keyword-only ``intent: IntentInfo`` parameter receives
    it and can pass ``intent_id`` downstream as an idempotency key. That closes the one window
    in which the effector could execute an intent twice (a crash after the tool ran but before
    its result was recorded). The parameter is not an argument: it never appears in the tool's
    schema, and arguments that try to supply it are rejected.
    """

    intent_id: str
    entity_key: bytes
    seq: int
    step_index: int
    attempt: int

    def __post_init__(self) -> None:
        expected: tuple[tuple[str, type, object], ...] = (
            ("intent_id", str, self.intent_id),
            ("entity_key", bytes, self.entity_key),
            ("seq", int, self.seq),
            ("step_index", int, self.step_index),
            ("attempt", int, self.attempt),
        )
        for field_name, field_type, value in expected:
            # bool is an int subclass, but a flag where a counter belongs is always a mistake.
            if not isinstance(value, field_type) or isinstance(value, bool):
                raise TypeError(
                    f"IntentInfo.{field_name} must be {field_type.__name__}, "
                    f"got {type(value).__name__}"
                )
