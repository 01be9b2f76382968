"""Typed errors the runtime raises inside an activation, and the stable ``.errors`` reasons.

An exception that escapes an agent fails its activation: nothing is committed and the envelope
goes to ``RunAgentOutputs.errors`` with reason ``activation_error``, or a more specific one:
``activation_timeout``, ``model_error`` (a ``ProviderError`` from a model call) or
``budget_exceeded``.
The classes below are what the activation context raises when it is misused, so that a test or
a dead-letter consumer can tell the causes apart by type and by reason.
"""

from __future__ import annotations

import enum

from beam_agents.tools.errors import ToolError


class ErrorReason(enum.StrEnum):
    """The machine-readable ``reason`` of an ``AgentError`` record on ``.errors``."""

    ACTIVATION_ERROR = "activation_error"
    """The agent raised (or returned something other than ``Complete``/``Suspend``)."""
    ACTIVATION_TIMEOUT = "activation_timeout"
    """The activation ran longer than ``AgentConfig.activation_timeout_s``."""
    ORPHANED_RESULT = "orphaned_result"
    """A tool result or approval that matches no pending intent; the detail says why."""
    STALE_APPROVAL = "stale_approval"
    """An approval decided on other arguments than its pending intent's (its ``args_digest``
    differs): not applied, the run keeps waiting."""
    MALFORMED_ELEMENT = "malformed_element"
    """The element is not a ``(bytes, AgentEnvelope)`` pair."""
    EMPTY_KEY = "empty_key"
    """The element's key is empty."""
    KEY_MISMATCH = "key_mismatch"
    """The element's key differs from its envelope's ``entity_key``."""
    MISSING_PAYLOAD = "missing_payload"
    """The envelope carries no event, tool result or approval."""
    BUFFER_OVERFLOW = "buffer_overflow"
    """An external event arrived for a suspended key whose event buffer was full."""
    SUSPENSION_DROPPED = "suspension_dropped"
    """A suspended run reached its deadline and its timeout route was ``Drop``."""
    SUSPENSION_WIPED = "suspension_wiped"
    """A suspended run was discarded by idle-key cleanup before it was resumed."""
    TIMEOUT_ROUTE_ERROR = "timeout_route_error"
    """The HITL ``on_timeout`` route raised or returned something that is not a route."""
    MODEL_ERROR = "model_error"
    """A model call failed for good and the agent let the ``ProviderError`` escape: retries
    exhausted, an error that is not retried (a bad request, an undecodable body), or the
    endpoint's circuit open. Nothing was committed; the envelope can be re-driven."""
    BUDGET_EXCEEDED = "budget_exceeded"
    """The run's model calls went past ``AgentConfig.max_tokens_per_run`` (resumes included).
    Nothing was committed; re-driving fails the same way unless the budget is raised."""


class AgentRuntimeError(Exception):
    """Base class of the errors the activation context raises."""


class StateSchemaError(AgentRuntimeError):
    """A state blob was written by a newer schema version than this code understands."""


class MemoryLimitError(AgentRuntimeError, ValueError):
    """A working-memory write would take the key's memory past its size cap."""


class MemorySlotError(AgentRuntimeError, TypeError):
    """A working-memory call used a bad key or value, or the wrong kind of slot."""


class ModelNotConfiguredError(AgentRuntimeError):
    """The agent called the model but ``AgentConfig.provider_factory`` is not set."""


class InvalidOutcomeError(AgentRuntimeError, TypeError):
    """The agent returned something that is not a valid ``Complete`` or ``Suspend``."""


class BudgetExceededError(AgentRuntimeError):
    """The run's model calls used more tokens than ``AgentConfig.max_tokens_per_run``.

    Raised by ``ctx.call_model``; the activation fails as ``budget_exceeded`` even if the agent
    catches it.
    """


class ActivationTimeoutError(AgentRuntimeError, TimeoutError):
    """The activation did not finish within ``AgentConfig.activation_timeout_s``."""


class ReadOnlyIntentError(ToolError):
    """``ctx.act`` named a read-only tool, which runs inline with ``ctx.run_tool`` instead."""


class CompensationError(AgentRuntimeError, ValueError):
    """``ctx.compensate`` was given an intent it cannot compensate.

    ``intent_id`` names it; the message says why: not an intent of this run, staged without
    ``compensate_with``, or already compensated (in an earlier step of the run).
    """

    def __init__(self, message: str, *, intent_id: str) -> None:
        super().__init__(message)
        self.intent_id = intent_id
