"""What an agent is, what it returns, and the deterministic identity of what it requests.

An agent is a module-level ``async def agent(ctx: ActivationContext) -> Complete | Suspend``.
It returns :class:`Complete` when it is done, or :class:`Suspend` to wait for the results of
the intents it staged (and for approvals). Everything it requests gets an id from
:func:`intent_id_for`, a pure function of the key, the run's ``seq`` and the step position,
so a retried bundle that walks the same path mints byte-identical intents.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

from beam_agents.core.ids import hyphenated, uuid5_hex

if TYPE_CHECKING:
    from beam_agents.core.context import ActivationContext

INTENT_NAMESPACE = uuid.UUID("396f639f-0714-5193-8a2d-3dad80bac0d8")
"""The uuid5 namespace of intent ids: ``uuid5(NAMESPACE_URL, "urn:beam-agents:intent")``.

Fixed forever. Changing it would change every intent id, and the effector deduplicates on them.
"""


def intent_id_for(entity_key: bytes, seq: int, step_index: int) -> str:
    """The id of the intent staged by run ``seq`` of ``entity_key`` at step ``step_index``.

    ``str(uuid5(INTENT_NAMESPACE, f"{entity_key.hex()}|{seq}|{step_index}"))``. A key's first
    run has ``seq == 0`` and its first step has ``step_index == 0``.
    """
    return hyphenated(uuid5_hex(INTENT_NAMESPACE, f"{entity_key.hex()}|{seq}|{step_index}"))


@dataclass(frozen=True, slots=True)
class Complete:
    """The run is finished; a non-empty ``output`` is emitted on ``RunAgentOutputs.output``."""

    output: bytes = b""

    def __post_init__(self) -> None:
        if not isinstance(self.output, bytes):
            raise TypeError(
                f"Complete.output must be bytes, got {type(self.output).__name__}; "
                "encode text with .encode() or structured data with canonical_json_bytes()"
            )


@dataclass(frozen=True, slots=True)
class Suspend:
    """Persist the run and wait for results of the intents it is waiting on.

    ``snapshot`` comes back as ``ctx.snapshot`` when the run resumes; ``adapter`` names the
    framework adapter that wrote it (empty for plain agents). ``timeout_ms`` overrides the
    HITL policy's timeout: after that much processing time without being resumed, the policy's
    timeout route is taken (with no policy, the run is dropped to ``.errors``).
    """

    snapshot: bytes = b""
    adapter: str = ""
    timeout_ms: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.snapshot, bytes):
            raise TypeError(f"Suspend.snapshot must be bytes, got {type(self.snapshot).__name__}")
        if not isinstance(self.adapter, str):
            raise TypeError(f"Suspend.adapter must be str, got {type(self.adapter).__name__}")
        if self.timeout_ms is not None and (
            isinstance(self.timeout_ms, bool)
            or not isinstance(self.timeout_ms, int)
            or self.timeout_ms <= 0
        ):
            raise ValueError(
                f"Suspend.timeout_ms must be a positive int of milliseconds or None, "
                f"got {self.timeout_ms!r}"
            )


Outcome: TypeAlias = Complete | Suspend
"""What an agent returns."""

AgentFn: TypeAlias = Callable[["ActivationContext"], Coroutine[Any, Any, Outcome]]
"""The shape of an agent: ``async def agent(ctx) -> Complete | Suspend``."""


@dataclass(frozen=True, slots=True)
class FallbackContext:
    """What a HITL timeout route (``HitlPolicy.on_timeout``) is given to decide on.

    Every field is a pure function of the key's state and the timer, so a retried timer bundle
    hands the route the same context and reaches the same decision. ``deadline_ms`` and
    ``fired_at_ms`` are processing time (epoch milliseconds on the runner's clock);
    ``fired_at_ms`` is the timestamp of the timer that fired.
    """

    entity_key: bytes
    seq: int
    snapshot: bytes
    deadline_ms: int
    fired_at_ms: int
    pending_intent_ids: frozenset[str]
