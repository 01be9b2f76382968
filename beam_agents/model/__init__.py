"""Model clients: the neutral request/response types, the fake for tests, and HTTP providers.

Nothing here imports Apache Beam, ``beam_agents.core`` or ``beam_agents.io``; the module map is
in ``beam_agents/model/README.md``.
"""
