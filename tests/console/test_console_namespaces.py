"""Acceptance: two pipelines of different namespaces on one key show as two runs, errors apart.

Each pipeline runs on Beam's ``FnApiRunner`` from fresh state, so both runs of the key are run
0: one without a namespace that completes, one in namespace ``v2`` that fails. Their ``.traces``
and ``.errors`` are stored in one effector by ``WriteTraces`` and ``WriteErrors``; the key's
page must show two runs, each with its own spans, and the error under the run it belongs to.
"""

from __future__ import annotations

import apache_beam as beam
from apache_beam.runners.portability.fn_api_runner.fn_runner import FnApiRunner

from beam_agents import AgentConfig, AgentEnvelope, RunAgent
from beam_agents.core.agent import Complete
from beam_agents.core.context import ActivationContext
from beam_agents.core.observability import trace_id_for
from beam_agents.io import WriteErrors, WriteTraces
from beam_agents.model.client import LlmRequest
from beam_agents.model.fake import FakeLLM, match_any, respond_with
from effector.launch import EffectorThread
from tests.console.harness import client_for

KEY = b"shared-customer-9"


def make_provider() -> FakeLLM:
    """A model that always answers the same."""
    return FakeLLM([(match_any(), respond_with(b"fine"))])


async def agent(ctx: ActivationContext) -> Complete:
    """Ask the model; an event saying ``fail`` fails the activation after the call."""
    await ctx.call_model(LlmRequest(model_id="checker", messages=[ctx.event.decode()]))
    if ctx.event == b"fail":
        raise RuntimeError("v2 cannot handle this event")
    return Complete(output=b"done")


def run_once(address: str, namespace: str | None, event: bytes) -> None:
    """One pipeline, from fresh state, over one event of ``KEY``."""
    config = AgentConfig(provider_factory=make_provider, namespace=namespace)
    with beam.Pipeline(runner=FnApiRunner()) as pipeline:
        envelope = AgentEnvelope(entity_key=KEY, event_time_ms=1_000, external_event=event)
        ran = pipeline | beam.Create([(KEY, envelope)]) | RunAgent(agent, config=config)
        ran.traces | WriteTraces(address)
        ran.errors | WriteErrors(address)


def test_two_namespaces_on_one_key_and_seq_show_as_two_runs(effector: EffectorThread) -> None:
    run_once(effector.address, None, b"ok")
    run_once(effector.address, "v2", b"fail")
    plain, v2 = trace_id_for(KEY, 0), trace_id_for(KEY, 0, "v2")
    assert plain != v2
    with client_for(effector) as client:
        page = client.get(f"/keys/{KEY.hex()}").text
    assert page.count('<section class="run"') == 2
    sections = {
        trace: page[page.index(f'id="run-0-{trace}"') :].split("</section>", 1)[0]
        for trace in (plain, v2)
    }
    assert '<span class="namespace">namespace v2</span>' in sections[v2]
    assert 'class="namespace hint"' in sections[plain]  # no namespace, one of several runs 0
    assert 'class="status completed"' in sections[plain]
    assert 'class="status failed"' in sections[v2]
    assert "Errors of this run" in sections[v2] and "Errors of this run" not in sections[plain]
    assert sections[plain].count('<tr class="llm">') == 1  # a failed run keeps only its error
    assert sections[v2].count('<tr class="error">') == 1 and '<tr class="llm">' not in sections[v2]
