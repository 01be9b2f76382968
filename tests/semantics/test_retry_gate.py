# mypy: disallow-untyped-calls=False
"""Retry gate: forced bundle retries on 1% of commits change nothing and repeat no cached call.

1,000 keys each take an external event (the agent calls the model, stages an intent and
suspends) and then its tool result, fed back by the test as the effector would publish it
(the agent resumes, re-walks its first model call and intent, which the replay prefix serves
from the committed cache, then calls the model again and completes). The stream runs twice on
the ``BundleBasedDirectRunner`` (streaming, ``TestStream`` input): once plain, once with
``FailFirstCommit`` failing the first commit of 1% of the activations, so the runner retries
their bundles. Outputs and intents must be identical byte for byte, traces by identity (byte
for byte without their wall-clock times; all as sorted multisets), and the provider must never
be asked anything twice: every resumed activation, however often its bundle ran, is served its
first call from the cache, and a retried activation its own calls from the answer memo.
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import apache_beam as beam
from apache_beam.coders import BytesCoder, ProtoCoder, TupleCoder
from apache_beam.testing import test_stream
from apache_beam.transforms.window import TimestampedValue

from beam_agents import AgentConfig, Complete, Suspend
from beam_agents._protos import AgentEnvelope, ToolResult
from beam_agents.core.agent import intent_id_for
from beam_agents.core.config import CommitInfo
from beam_agents.core.context import ActivationContext
from beam_agents.core.observability import identity_of
from beam_agents.model.client import LlmRequest, LlmResponse
from beam_agents.model.fake import FakeLLM, match_contains, respond_with_fn
from beam_agents.testing import FailFirstCommit
from tests.core.harness import Outputs, SharedProvider, run_agent

N_KEYS = 1_000
STEP_SIZE = 100
"""Envelopes per ``TestStream`` step. One step per envelope would cost ~17 ms each."""
SEED = 20_260_301
RESULT_TIME_MS = 10_000_000

# Activations started, by (key, trigger). The BundleBasedDirectRunner runs the agent in this
# process, so the test can count how often each activation ran (bundle retries included) and
# hold the provider's calls against that. Cleared before each run; runs are sequential.
_ACTIVATIONS: Counter[tuple[bytes, str]] = Counter()
_ACTIVATIONS_LOCK = threading.Lock()


def _request(text: str) -> LlmRequest:
    return LlmRequest(model_id="planner", messages=[{"role": "user", "content": text}])


def _echo(request: LlmRequest) -> bytes:
    # The answer depends on the request, so every key's outputs differ.
    return ("re: " + str(request.messages[0]["content"])).encode()


def make_fake() -> FakeLLM:
    return FakeLLM(
        [
            (match_contains("plan"), respond_with_fn(_echo)),
            (match_contains("summarize"), respond_with_fn(_echo)),
        ]
    )


async def plan_ship_summarize(ctx: ActivationContext) -> Complete | Suspend:
    """Plan (model), remember, ship (intent), suspend; on resume re-walk, then summarize."""
    with _ACTIVATIONS_LOCK:
        _ACTIVATIONS[(ctx.entity_key, "tool_result" if ctx.is_resume else "event")] += 1
    plan: LlmResponse = await ctx.call_model(_request(f"plan {ctx.entity_key.decode()}"))
    ctx.act("ship", {"plan": plan.text})
    if not ctx.is_resume:
        ctx.memory.append("plans", plan.response)
        return Suspend(snapshot=plan.response)
    result = ctx.resume_result
    assert result is not None
    summary = await ctx.call_model(_request(f"summarize {result.payload.decode()}"))
    return Complete(output=ctx.entity_key + b" " + summary.response)


def key_of(index: int) -> bytes:
    return f"acct-{index:04d}".encode()


def shipment_of(key: bytes) -> str:
    """The id of the key's ``ship`` intent: run 0, step 1 (step 0 is the model call)."""
    return intent_id_for(key, 0, 1)


def envelopes() -> list[AgentEnvelope]:
    """Every key's event, then every key's tool result (as the effector would publish it)."""
    events = [
        AgentEnvelope(entity_key=key_of(i), event_time_ms=1_000 + i, external_event=b"order")
        for i in range(N_KEYS)
    ]
    results = []
    for i in range(N_KEYS):
        key = key_of(i)
        result = ToolResult(
            intent_id=shipment_of(key),
            entity_key=key,
            status=ToolResult.OK,
            payload=f'"tracking-{i}"'.encode(),
            completed_at_ms=RESULT_TIME_MS + i,
            attempt=1,
        )
        results.append(
            AgentEnvelope(entity_key=key, event_time_ms=RESULT_TIME_MS + i, tool_result=result)
        )
    return events + results


def steps() -> list[list[AgentEnvelope]]:
    everything = envelopes()
    return [everything[i : i + STEP_SIZE] for i in range(0, len(everything), STEP_SIZE)]


def stream_source(pipeline: beam.Pipeline) -> Any:
    """A ``TestStream`` with ``STEP_SIZE`` envelopes per step, timestamped by event time."""
    stream = test_stream.TestStream(coder=TupleCoder([BytesCoder(), ProtoCoder(AgentEnvelope)]))
    for step in steps():
        stream.add_elements(
            [TimestampedValue((e.entity_key, e), e.event_time_ms / 1000) for e in step]
        )
    stream.advance_watermark_to_infinity()
    return pipeline | "Stream" >> stream.with_output_types(tuple[bytes, AgentEnvelope])


def trigger_of(envelope: AgentEnvelope) -> str:
    return "event" if envelope.HasField("external_event") else "tool_result"


def chosen_commits(rng: random.Random) -> frozenset[tuple[bytes, str]]:
    """One activation per ``TestStream`` step, at random: 1% of the 2,000 commits.

    One per step keeps each bundle to one forced failure, well within the runner's four
    attempts per bundle.
    """
    return frozenset(
        (picked.entity_key, trigger_of(picked)) for picked in (rng.choice(s) for s in steps())
    )


class FailChosenCommits:
    """``FailFirstCommit`` restricted to a chosen set of ``(entity_key, trigger)`` activations."""

    def __init__(self, directory: Path, chosen: frozenset[tuple[bytes, str]]) -> None:
        self.first_commit = FailFirstCommit(directory)
        self._chosen = chosen

    def __call__(self, info: CommitInfo) -> None:
        if (info.entity_key, info.trigger) in self._chosen:
            self.first_commit(info)


def fingerprint(outputs: Outputs) -> tuple[list[bytes], list[bytes], list[bytes]]:
    """Outputs, intents and trace identities, each as a sorted multiset of bytes."""
    return (
        sorted(outputs.output),
        sorted(intent.SerializeToString(deterministic=True) for intent in outputs.intents),
        sorted(identity_of(event) for event in outputs.traces),
    )


def run(
    provider: SharedProvider, before_commit: FailChosenCommits | None
) -> tuple[Outputs, Counter[tuple[bytes, str]]]:
    with _ACTIVATIONS_LOCK:
        _ACTIVATIONS.clear()
    config = AgentConfig(provider_factory=provider, before_commit=before_commit)
    outputs = run_agent(stream_source, plan_ship_summarize, config, streaming=True)
    with _ACTIVATIONS_LOCK:
        return outputs, Counter(_ACTIVATIONS)


def provider_calls(fake: FakeLLM) -> Counter[tuple[bytes, str]]:
    """The provider's calls by (key, kind): ``plan`` calls name their key; a ``summarize``
    call names its tracking number, which maps back to its key."""
    calls: Counter[tuple[bytes, str]] = Counter()
    for request in fake.requests:
        kind, subject = str(request.messages[0]["content"]).split(" ", 1)
        key = subject.encode() if kind == "plan" else key_of(int(subject.strip('"').split("-")[1]))
        calls[(key, "event" if kind == "plan" else "tool_result")] += 1
    return calls


def test_forced_retries_on_one_percent_of_commits_change_nothing(
    tmp_path: Path, gate_report: Any
) -> None:
    plain_provider = SharedProvider(make_fake())
    plain, plain_runs = run(plain_provider, None)

    chosen = chosen_commits(random.Random(SEED))
    forcing = FailChosenCommits(tmp_path / "markers", chosen)
    forced_provider = SharedProvider(make_fake())
    forced, forced_runs = run(forced_provider, forcing)

    # The plain run: every key completed once, every activation ran once.
    assert plain.errors == [] and forced.errors == []
    assert len(plain.output) == N_KEYS
    assert sorted(i.intent_id for i in plain.intents) == sorted(
        shipment_of(key_of(i)) for i in range(N_KEYS)
    )
    assert set(plain_runs.values()) == {1} and len(plain_runs) == 2 * N_KEYS

    # 1% of the 2,000 commits failed once each (a marker per forced activation); the event
    # commits take the run's first step 0, the resumes the step after the model call and intent.
    assert len(chosen) == 2 * N_KEYS // 100
    expected_markers = sorted(
        f"{key.hex()}-0-{trigger}-{0 if trigger == 'event' else 2}" for key, trigger in chosen
    )
    assert forcing.first_commit.forced() == expected_markers
    retried_activations = sum(forced_runs.values()) - 2 * N_KEYS
    assert retried_activations >= len(chosen)

    # Byte for byte the same outputs and intents; the same traces but for their wall times,
    # which every event has (a retried activation ran later, so its times are its own).
    assert fingerprint(forced) == fingerprint(plain)
    assert all(0 < e.wall_start_unix_nano <= e.wall_end_unix_nano for e in forced.traces)

    # The provider was asked each question once: a resumed activation re-walks its committed
    # plan call from the cache, and a retried activation, which committed nothing, gets the
    # answers its failed attempt was given from the worker's answer memo, so the forced run
    # makes exactly the plain run's calls however many times its bundles ran.
    plain_calls = provider_calls(plain_provider.fake)
    forced_calls = provider_calls(forced_provider.fake)
    assert plain_calls == plain_runs
    assert forced_calls == plain_calls
    assert set(forced_provider.fake.calls_per_request().values()) == {1}
    extra_calls = forced_provider.fake.call_count - plain_provider.fake.call_count
    assert extra_calls == 0
    gate_report(
        "retry",
        f"keys={N_KEYS} commits={2 * N_KEYS} forced={len(forcing.first_commit.forced())} "
        f"({100 * len(chosen) / (2 * N_KEYS):.0f}%) retried_activations={retried_activations} "
        f"outputs={len(forced.output)} intents={len(forced.intents)} traces={len(forced.traces)} "
        f"identical=yes model_calls plain={plain_provider.fake.call_count} "
        f"forced={forced_provider.fake.call_count} extra={extra_calls} seed={SEED}",
    )
