"""The upstream project's documented import paths keep working (issue 41, API.md third wave).

Users arrive with code from that project's docs. Each documented module imports and exposes
its names, which are the objects the root exports; an upstream-style program runs on them.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import beam_agents

ROOT = Path(__file__).resolve().parent.parent

UPSTREAM_PATHS: dict[str, list[str]] = {
    "beam_agents._protos": ["AgentEnvelope", "ToolResult", "TraceEvent", "ToolIntent", "Approval"],
    "beam_agents.core.agent": ["Complete", "Suspend", "intent_id_for", "FallbackContext"],
    "beam_agents.core.context": ["ActivationContext"],
    "beam_agents.hitl": ["Route", "HitlPolicy", "Deny", "Drop", "Escalate", "FallbackContext"],
    "beam_agents.model.client": ["LlmRequest"],
    "beam_agents.model.fake": ["FakeLLM", "match_any", "respond_with"],
    "beam_agents.tools": ["tool", "Tool", "ToolRegistry", "ToolRunner", "IntentInfo"],
    "beam_agents.tools.errors": [
        "ToolError",
        "ToolDefinitionError",
        "ToolNotFoundError",
        "ToolArgumentError",
        "SideEffectToolError",
    ],
}


@pytest.mark.parametrize("path", sorted(UPSTREAM_PATHS))
def test_each_upstream_path_imports_and_exposes_its_names(path: str) -> None:
    module = importlib.import_module(path)
    for name in UPSTREAM_PATHS[path]:
        value = getattr(module, name)
        assert value is not None, f"{path}.{name}"
        if name in beam_agents.__all__:  # one object, whichever path imports it
            assert value is getattr(beam_agents, name), f"{path}.{name}"


def test_the_hitl_module_re_exports_the_policy_that_lives_with_the_config() -> None:
    from beam_agents.core.config import HitlPolicy
    from beam_agents.hitl import HitlPolicy as Documented

    assert Documented is HitlPolicy


def test_every_root_name_resolves() -> None:
    assert beam_agents.__all__
    for name in beam_agents.__all__:
        assert getattr(beam_agents, name) is not None, name
        namespace: dict[str, object] = {}
        exec(f"from beam_agents import {name}", namespace)
        assert namespace[name] is getattr(beam_agents, name)


def test_the_tool_errors_share_one_base() -> None:
    from beam_agents.tools.errors import (
        SideEffectToolError,
        ToolArgumentError,
        ToolDefinitionError,
        ToolError,
        ToolNotFoundError,
    )

    for error in (ToolDefinitionError, ToolNotFoundError, ToolArgumentError, SideEffectToolError):
        assert issubclass(error, ToolError), error


def test_the_upstream_outcomes_and_ids_behave_as_documented() -> None:
    from beam_agents.core.agent import Complete, Suspend, intent_id_for

    assert Complete().output == b"" and Complete(output=b"done").output == b"done"
    waiting = Suspend(snapshot=b"s", timeout_ms=5)
    assert (waiting.snapshot, waiting.adapter, waiting.timeout_ms) == (b"s", "", 5)
    first = intent_id_for(b"key", 0, 0)
    assert first == intent_id_for(b"key", 0, 0) != intent_id_for(b"key", 0, 1)
    assert intent_id_for(b"key", 0, 0, namespace=None) == first


def test_the_upstream_llm_request_takes_four_positional_arguments() -> None:
    from beam_agents.model.client import LlmRequest

    request = LlmRequest("model-1", [{"role": "user", "content": "hi"}], None, None)
    assert request.model_id == "model-1"
    assert list(request.messages) == [{"role": "user", "content": "hi"}]
    assert list(request.tools_schema) == [] and dict(request.sampling_params) == {}
    plain = LlmRequest("model-1", ["hi"], None, None)
    assert plain.canonical_json() == request.canonical_json()
    tools = [{"name": "t", "description": "", "parameters": {"type": "object"}}]
    offered = LlmRequest("model-1", ["hi"], tools, {"temperature": 0})
    assert offered.canonical_json() != request.canonical_json()


UPSTREAM_PROGRAM = '''
"""A refund agent written as the upstream docs write it: each import from a documented path."""

import apache_beam as beam
from apache_beam.coders import BytesCoder, ProtoCoder, TupleCoder
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner
from apache_beam.testing.test_stream import TestStream
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms.window import TimestampedValue

from beam_agents import AgentConfig, RunAgent
from beam_agents._protos import AgentEnvelope, ToolResult, TraceEvent
from beam_agents.core.agent import Complete, Suspend, intent_id_for
from beam_agents.core.context import ActivationContext
from beam_agents.hitl import Deny, FallbackContext, HitlPolicy, Route
from beam_agents.model.client import LlmRequest
from beam_agents.model.fake import FakeLLM, match_any, respond_with
from beam_agents.tools import ToolRegistry, tool
from beam_agents.tools.errors import SideEffectToolError


@tool(side_effect=True)
def refund(order: str) -> str:
    """Refund an order. Executed by the effector, never in the pipeline."""
    return f"refunded {order}"


def make_provider() -> FakeLLM:
    return FakeLLM([(match_any(), respond_with(b"refund"))])


def give_up(fallback: FallbackContext) -> Route:
    return Deny(b"nobody answered for " + fallback.snapshot)


async def agent(ctx: ActivationContext) -> Complete | Suspend:
    if ctx.is_resume:
        return Complete(output=ctx.snapshot + b": " + ctx.resume_result.payload)
    order = ctx.event.decode()
    answer = await ctx.call_model(LlmRequest("support", [order], None, None))
    if answer.text == "refund":
        ctx.act("refund", {"order": order})
        return Suspend(snapshot=ctx.event)
    return Complete(output=b"kept " + ctx.event)


def envelopes() -> TestStream:
    key = b"order-7"
    result = ToolResult(
        intent_id=intent_id_for(key, 0, 1),  # step 0 was the model call
        entity_key=key,
        status=ToolResult.OK,
        payload=b'"refunded A-7"',
        completed_at_ms=2_000,
    )
    stream = TestStream(coder=TupleCoder([BytesCoder(), ProtoCoder(AgentEnvelope)]))
    event = AgentEnvelope(entity_key=key, event_time_ms=1_000, external_event=b"A-7")
    stream.add_elements([TimestampedValue((key, event), 1)])
    stream.advance_watermark_to(1.5)
    resume = AgentEnvelope(entity_key=key, event_time_ms=2_000, tool_result=result)
    stream.add_elements([TimestampedValue((key, resume), 2)])
    return stream.advance_watermark_to_infinity()


def main() -> None:
    try:
        refund(order="A-7")
    except SideEffectToolError:
        print("upstream: refund refused outside the effector")
    options = PipelineOptions()
    options.view_as(StandardOptions).streaming = True
    policy = HitlPolicy(60_000, 60_000, "refunds", give_up)
    config = AgentConfig(
        provider_factory=make_provider, tool_registry=ToolRegistry([refund]), hitl_policy=policy
    )
    with beam.Pipeline(runner=BundleBasedDirectRunner(), options=options) as pipeline:
        keyed = pipeline | envelopes().with_output_types(tuple[bytes, AgentEnvelope])
        outputs = keyed | RunAgent(agent, config=config)
        assert_that(outputs.output, equal_to([b'A-7: "refunded A-7"']), label="output")
        names = outputs.intents | "Names" >> beam.Map(lambda intent: intent.tool_name)
        assert_that(names, equal_to(["refund"]), label="intents")
        kinds = outputs.traces | "Kinds" >> beam.Map(lambda event: event.event_type)
        suspended = kinds | beam.Filter(lambda kind: kind == TraceEvent.SUSPENDED)
        assert_that(suspended, equal_to([TraceEvent.SUSPENDED]), label="suspended")
        assert_that(outputs.errors, equal_to([]), label="errors")
    print("upstream: ok")


if __name__ == "__main__":
    main()
'''


def test_an_upstream_docs_program_runs_on_the_documented_paths(tmp_path: Path) -> None:
    program = tmp_path / "upstream_refunds.py"
    program.write_text(textwrap.dedent(UPSTREAM_PROGRAM))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(
        [sys.executable, str(program)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    assert done.stdout.splitlines() == [
        "upstream: refund refused outside the effector",
        "upstream: ok",
    ]
