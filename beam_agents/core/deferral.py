"""Answers kept in a key's buffer while its run's replay cache is in the old ``cache`` cell.

A run suspended by a release before the cache moved into the continuation has its cache in a
cell ``process`` does not bind; an answer to it waits in the buffer, among the events waiting
for the run, until a timer callback moves the cache (``core/README.md``, "State layout").
"""

from __future__ import annotations

from beam_agents._protos import AgentEnvelope
from beam_agents.core.state import KeyState


def deferred_answers(state: KeyState) -> list[AgentEnvelope]:
    """Take the deferred answers out of the buffer, in arrival order (the events stay)."""
    events: list[bytes] = []
    answers: list[AgentEnvelope] = []
    for blob in state.buffered():
        envelope = AgentEnvelope.FromString(blob)
        if envelope.HasField("external_event"):
            events.append(blob)
        else:
            answers.append(envelope)
    if answers:
        state.replace_buffer(events)
    return answers


def events_waiting(state: KeyState) -> int:
    """How many external events wait for the key's run (deferred answers are not counted)."""
    waiting = state.buffered()
    if not (state.cache_in_cell or state.cache_moved):  # then no answer can be deferred
        return len(waiting)
    return sum(AgentEnvelope.FromString(blob).HasField("external_event") for blob in waiting)


def arrived_in_time() -> int:
    """The processing time a deferred answer is checked at: never past its run's deadline.

    The deadline was checked when the answer arrived.
    """
    return 0
