"""One log line for every intent the effector refuses or fails, so that none goes unnoticed.

Rejections (malformed, invalid, or a conflict: the same id with different content), expiries
and tool errors each log a line naming the intent id, its entity key and its tool, once, when
they are recorded. A tool error's traceback goes to DEBUG. The lines go to the
``effector.audit`` logger.
"""

from __future__ import annotations

import logging

from beam_agents._protos import ToolIntent, ToolResult
from effector.intents import display_key

_log = logging.getLogger(__name__)

CONFLICT_HINT = "set AgentConfig.namespace when two agents or pipelines share an effector"
"""What a conflict's log line suggests: the usual cause is two minters of the same ids."""

_SHOWN_CHARS = 120


def describe(intent: ToolIntent) -> str:
    """``intent <id> (key <key>, tool '<name>')``: how every line names an intent."""
    return (
        f"intent {_cut(intent.intent_id)} (key {_cut(display_key(intent.entity_key))}, "
        f"tool {_cut(repr(intent.tool_name))})"
    )


def differences(recorded: ToolIntent, submitted: ToolIntent) -> str:
    """Each field whose value differs, as ``field: recorded ... submitted ...``."""
    parts = []
    for field in ToolIntent.DESCRIPTOR.fields:
        kept, new = getattr(recorded, field.name), getattr(submitted, field.name)
        if kept != new:
            parts.append(
                f"{field.name}: recorded {_shown(field.name, kept)}, submitted "
                f"{_shown(field.name, new)}"
            )
    return "; ".join(parts) or "no field differs (only their encoding)"


def _shown(name: str, value: object) -> str:
    if name == "kind" and isinstance(value, int):
        known = value in ToolIntent.Kind.values()
        return ToolIntent.Kind.Name(value) if known else str(value)
    return _cut(display_key(value) if isinstance(value, bytes) else repr(value))


def _cut(text: str) -> str:
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."


def conflict(submitted: ToolIntent, recorded: ToolIntent | None) -> None:
    """An intent was refused because its id is recorded with different content."""
    what = "unknown" if recorded is None else differences(recorded, submitted)
    _log.warning(
        "REJECTED %s: conflict, its id is already recorded with different content (%s); the "
        "first submission is kept. Two agents or pipelines minting the same ids? %s",
        describe(submitted),
        what,
        CONFLICT_HINT,
    )


def rejected(intent: ToolIntent, reason: str) -> None:
    """An intent was refused without running (malformed or invalid)."""
    _log.warning("REJECTED %s: %s", describe(intent), reason)


def expired(intents: list[ToolIntent]) -> None:
    """Intents were refused as EXPIRED: a tool intent not run, or an approval not decided, in time.

    A tool intent that expires is a WARNING (the effector fell behind, or was down); an
    approval nobody decided in time is the usual end of a human-in-the-loop wait: INFO.
    """
    for intent in intents:
        if intent.kind == ToolIntent.APPROVAL:
            _log.info("EXPIRED %s: no decision before its deadline", describe(intent))
        else:
            _log.warning("EXPIRED %s: its TTL ran out before it was run", describe(intent))


def tool_failed(intent: ToolIntent, result: ToolResult, error: BaseException | None) -> None:
    """A tool ran and failed (raised, timed out, returned what is not JSON): its ERROR result."""
    _log.warning("ERROR %s, attempt %d: %s", describe(intent), result.attempt, result.error_message)
    if error is not None and _log.isEnabledFor(logging.DEBUG):
        _log.debug("traceback of %s, attempt %d", describe(intent), result.attempt, exc_info=error)


def reconciled(intent: ToolIntent, attempt: int) -> None:
    """An intent's effect was found by its reconciler and recorded as its result, not re-run."""
    _log.info(
        "RECONCILED %s, attempt %d: its effect had already happened; recorded without "
        "executing again",
        describe(intent),
        attempt,
    )


def in_doubt(intent: ToolIntent, attempt: int, reason: str, retry_in_ms: int) -> None:
    """An intent's reconciler failed: it is IN_DOUBT, held, and asked again after a backoff."""
    _log.warning(
        "IN_DOUBT %s, attempt %d: its reconciler failed (%s); not executed again, its key is "
        "held, asking again in %d ms",
        describe(intent),
        attempt,
        reason,
        retry_in_ms,
    )


def not_needed(intent: ToolIntent, reason: str) -> None:
    """A compensation was recorded NOT_NEEDED: the intent it undoes never ran."""
    _log.info("NOT_NEEDED %s: %s", describe(intent), reason)
