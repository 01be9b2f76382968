"""Beam transforms that connect a pipeline to the effector sidecar.

:class:`SubmitIntents` sends ``RunAgent(...).intents`` to an effector, :class:`ReadEnvelopes`
reads its envelope stream back for ``RunAgent``, and :class:`EffectorConnection` holds the
target, bearer token and TLS settings both share. How to close the loop on streaming and
local runners is in ``beam_agents/io/README.md``.
"""

from beam_agents.io.connection import EffectorConnection
from beam_agents.io.read import ReadEnvelopes
from beam_agents.io.submit import SubmitIntents, SubmitIntentsOutputs

__all__ = ["EffectorConnection", "ReadEnvelopes", "SubmitIntents", "SubmitIntentsOutputs"]
