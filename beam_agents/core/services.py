"""What every activation of one runtime instance shares, built from its ``AgentConfig``.

:func:`activation_services` is used by the ``DoFn`` (with the instance's model gateway) and by
``beam_agents.replay`` (with a gateway answering from records), so both run agents alike.
"""

from __future__ import annotations

from collections.abc import Callable

from beam_agents.core.config import AgentConfig
from beam_agents.core.context import ActivationServices
from beam_agents.core.model_gateway import ModelGateway
from beam_agents.tools import ToolRunner


def activation_services(
    config: AgentConfig,
    model: ModelGateway | None,
    tool_runner: ToolRunner,
    time_left_s: Callable[[], float | None],
) -> ActivationServices:
    """The services for ``config``'s activations: ``model`` and ``tool_runner`` as given."""
    policy = config.hitl_policy
    return ActivationServices(
        model=model,
        tool_registry=config.tool_registry,
        tool_runner=tool_runner,
        intent_ttl_ms=config.intent_ttl_ms,
        approval_channel="" if policy is None else policy.approval_channel,
        approval_ttl_ms=config.intent_ttl_ms if policy is None else policy.intent_ttl_ms,
        cache_max_entries=config.model_cache_max_entries,
        cache_max_bytes=config.model_cache_max_bytes,
        max_tokens_per_run=config.max_tokens_per_run,
        time_left_s=time_left_s,
        intent_namespace=config.namespace,
        required_approvals=1 if policy is None else policy.required_approvals,
    )
