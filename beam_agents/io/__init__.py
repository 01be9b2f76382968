"""Beam transforms that connect a pipeline to the effector sidecar.

- :class:`SubmitIntents` sends ``RunAgent(...).intents`` to an effector, batched per bundle,
  retrying transient failures (safe: the effector deduplicates on ``intent_id``).
- :class:`ReadEnvelopes` reads the effector's ordered envelope stream (tool results, approvals,
  published events) back as ``KV[bytes, AgentEnvelope]`` for ``RunAgent``.

On streaming runners, flatten ``ReadEnvelopes`` with your event source. On the DirectRunner,
give ``ReadEnvelopes`` the initial events too: it publishes them to the effector and then emits
them and every re-injected envelope from one source, which is the only shape in which Beam's
local runner can close a loop through an external service.
"""

from beam_agents.io.connection import EffectorConnection
from beam_agents.io.read import ReadEnvelopes
from beam_agents.io.submit import SubmitIntents, SubmitIntentsOutputs

__all__ = ["EffectorConnection", "ReadEnvelopes", "SubmitIntents", "SubmitIntentsOutputs"]
