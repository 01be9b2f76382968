# mypy: disallow-untyped-calls=False
# (Beam's own API is mostly unannotated; this module is glue around it.)
"""The model-call activation: one ``ctx.call_model`` on ``FakeLLM``, one memory slot, complete.

Shared by the benchmarks that time an activation doing real work: :func:`model_call_agent`
under ``RunAgent`` (:func:`model_call_stage`) and its floor, a bare stateful ``DoFn`` doing the
same state traffic (:func:`model_call_floor`): read the header and the memory cell, write the
header back and write a memory value of the size the agent's commit writes.
"""

from __future__ import annotations

import apache_beam as beam
from apache_beam.pvalue import PCollection

from beam_agents import AgentConfig, RunAgent
from beam_agents.core.agent import Complete
from beam_agents.core.context import ActivationContext
from beam_agents.core.memory import WorkingMemory
from beam_agents.model.client import LlmRequest
from beam_agents.model.fake import FakeLLM, match_any, respond_with
from benchmarks.pipelines import BareMemoryDoFn, Element

MODEL_ID = "bench"
REPLY = b"an answer"
"""What the fake model answers every request with (no latency)."""
SLOT = "reply"
"""The memory slot the agent writes."""


def make_provider() -> FakeLLM:
    """The model: answers :data:`REPLY` at once."""
    return FakeLLM([(match_any(), respond_with(REPLY))])


def make_config() -> AgentConfig:
    """The agent's config: :func:`make_provider` as its model."""
    return AgentConfig(provider_factory=make_provider)


def slot_value(seq: int, reply: bytes) -> bytes:
    """What the agent stores: the reply prefixed by the activation's seq (so it always changes)."""
    return seq.to_bytes(8, "little") + reply


async def model_call_agent(ctx: ActivationContext) -> Complete:
    """Ask the model about the event, keep the answer in working memory, complete."""
    reply = await ctx.call_model(LlmRequest(MODEL_ID, ctx.event.decode()))
    ctx.memory.set(SLOT, slot_value(ctx.seq, reply.response))
    return Complete()


def memory_bytes() -> int:
    """The size of the memory cell the agent's commit writes (the floor writes as many)."""
    memory = WorkingMemory(None)
    memory.set(SLOT, slot_value(0, REPLY))
    return memory.size


def model_call_stage(keyed: PCollection[Element]) -> None:
    """``RunAgent(model_call_agent)``: the stage under test."""
    keyed | "Agent" >> RunAgent(model_call_agent, config=make_config())


def model_call_floor(keyed: PCollection[Element]) -> None:
    """The floor: a bare stateful ``DoFn`` with the model-call activation's state traffic."""
    keyed | "Floor" >> beam.ParDo(BareMemoryDoFn(memory_bytes()))
