"""Model clients: the neutral request and response types, the fake for tests, HTTP providers.

Nothing here imports Apache Beam, ``beam_agents.core`` or ``beam_agents.io``.
"""

from beam_agents.model import client, fake
from beam_agents.model.anthropic import AnthropicMessagesProvider
from beam_agents.model.client import *  # noqa: F403  (its __all__ joins ours below)
from beam_agents.model.fake import *  # noqa: F403  (its __all__ joins ours below)
from beam_agents.model.openai import OpenAIChatProvider
from beam_agents.model.resilience import CircuitOpenError, RetryPolicy
from beam_agents.model.transport import HttpOptions, JsonHttpProvider

__all__ = [
    "AnthropicMessagesProvider",
    "CircuitOpenError",
    "HttpOptions",
    "JsonHttpProvider",
    "OpenAIChatProvider",
    "RetryPolicy",
]
__all__ += client.__all__
__all__ += fake.__all__
