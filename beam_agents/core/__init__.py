"""The agent runtime, without Apache Beam: an activation takes a key's state and returns a plan.

Read ``agent`` (what an agent is and returns) and ``context`` (what it sees) first, then
``activation`` (what each input does to a key). ``state`` is the key's state format, ``config``
the configuration and HITL policy, ``model_calls`` the replay cache and model gateway,
``observability`` the traces, logs and records. The Beam glue is ``beam_agents.io``.
"""
