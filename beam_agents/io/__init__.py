"""Beam transforms that connect a pipeline to the effector sidecar.

- :class:`SubmitIntents` sends ``RunAgent(...).intents`` to an effector in batches, retrying
  transient failures (safe: the effector deduplicates on ``intent_id``); what it cannot hand
  over goes to a dead-letter output with the reason.
- :class:`ReadEnvelopes` reads the effector's ordered envelope stream (tool results, approvals,
  published events) back as ``KV[bytes, AgentEnvelope]`` for ``RunAgent``.
- :class:`EffectorConnection` holds the target, bearer token and TLS settings both share.

On streaming runners, flatten ``ReadEnvelopes`` with your event source. On Beam's local runner
(``FnApiRunner``, which the DirectRunner uses for batch pipelines), give ``ReadEnvelopes`` the
initial events too: it publishes them to the effector and then emits them and every
re-injected envelope from one source, the only shape in which the local runner closes a loop
through an external service; ``stop_when_idle_s`` ends the run once the effector is idle.
(``BundleBasedDirectRunner`` cannot run ``ReadEnvelopes``: it has no splittable DoFns.)
"""

from beam_agents.io.connection import EffectorConnection
from beam_agents.io.read import ReadEnvelopes
from beam_agents.io.submit import SubmitIntents, SubmitIntentsOutputs

__all__ = ["EffectorConnection", "ReadEnvelopes", "SubmitIntents", "SubmitIntentsOutputs"]
