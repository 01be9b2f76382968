"""The local loop on Beam's local runners: the README's program, deadlines in wall-clock time.

The README's loop (``examples/local_loop.py``) runs on the default runner and on the
``FnApiRunner`` named explicitly: an approval nobody answers is denied after its one-second
timeout, and runs suspended for ten minutes resume on their tool results. A deadline fires when
its time has come and never before, on both runners, although the ``FnApiRunner`` fires every
processing-time timer when the bundle that set it ends.
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner
from apache_beam.runners.portability.fn_api_runner import FnApiRunner

from beam_agents import AgentConfig, Deny, HitlPolicy, RunAgent
from beam_agents._protos import AgentEnvelope
from beam_agents.core.agent import Complete, Suspend
from beam_agents.core.config import CommitInfo
from beam_agents.core.context import ActivationContext
from beam_agents.hitl import FallbackContext
from beam_agents.io import ReadEnvelopes, SubmitIntents
from beam_agents.testing import EnvelopeStream
from beam_agents.tools import ToolRegistry
from effector.launch import EffectorThread
from tests.io.io_harness import Collector

REPO = Path(__file__).resolve().parents[2]


def _example() -> Any:
    """``examples/local_loop.py``, the README's loop."""
    if str(REPO / "examples") not in sys.path:
        sys.path.insert(0, str(REPO / "examples"))
    return importlib.import_module("local_loop")


RUNNERS = {"default runner": {}, "FnApiRunner": {"runner": FnApiRunner()}}


@pytest.mark.parametrize("runner", sorted(RUNNERS))
def test_the_readme_loop_denies_the_unanswered_approval_and_completes_the_shipped_orders(
    tmp_path: Path, runner: str
) -> None:
    local_loop = _example()
    with EffectorThread(
        f"sqlite:///{tmp_path}/effector.db", local_loop.make_registry()
    ) as effector:
        local_loop.run(effector.address, str(tmp_path), **RUNNERS[runner])
    assert local_loop.read_lines(str(tmp_path)) == [
        "denied o-0",
        "done o-1",
        "done o-2",
        "done o-3",
    ]


def test_the_docs_show_the_loop_as_the_example_runs_it() -> None:
    """docs/loop.md includes the example's ``run`` between its snippet markers."""
    assert '--8<-- "examples/local_loop.py:run"' in (REPO / "docs" / "loop.md").read_text()
    example = (REPO / "examples" / "local_loop.py").read_text()
    shown = example.split("# --8<-- [start:run]\n")[1].split("# --8<-- [end:run]")[0]
    source = inspect.getsource(_example().run)
    assert shown.rstrip() + "\n" == source
    assert "beam.Pipeline(**pipeline_args)" in source  # no runner: the default one


# -- deadlines in wall-clock time ----------------------------------------------------------

_COMMITS: list[tuple[str, bytes, float]] = []
_LOCK = threading.Lock()


def _record_commit(info: CommitInfo) -> None:
    with _LOCK:
        _COMMITS.append((info.trigger, info.entity_key, time.monotonic()))


def _deny(fallback: FallbackContext) -> Deny:
    return Deny(b"timed out " + fallback.entity_key)


async def _waits(ctx: ActivationContext) -> Complete | Suspend:
    if ctx.is_resume:
        return Complete(output=b"answered " + ctx.entity_key)
    ctx.request_approval({"wait_ms": json.loads(ctx.event)["wait_ms"]})
    return Suspend(snapshot=b"-", timeout_ms=json.loads(ctx.event)["wait_ms"])


@pytest.mark.parametrize("runner", sorted(RUNNERS))
def test_a_deadline_fires_when_its_time_has_come_and_not_before(
    tmp_path: Path, runner: str
) -> None:
    _COMMITS.clear()
    events = [
        AgentEnvelope(
            entity_key=key,
            event_time_ms=1_000,
            external_event=json.dumps({"wait_ms": wait_ms}).encode(),
        )
        for key, wait_ms in ((b"short", 1_500), (b"long", 3_000))
    ]
    policy = HitlPolicy(
        timeout_ms=60_000, intent_ttl_ms=4_000, approval_channel="desk", on_timeout=_deny
    )
    config = AgentConfig(hitl_policy=policy, before_commit=_record_commit)
    collected = Collector.new()
    registry = ToolRegistry()
    with (
        EffectorThread(f"sqlite:///{tmp_path}/effector.db", registry) as eff,
        beam.Pipeline(**RUNNERS[runner]) as pipeline,
    ):
        keyed = pipeline | ReadEnvelopes(eff.address, events=events, stop_when_idle_s=0.5)
        outputs = keyed | RunAgent(_waits, config=config)
        outputs.intents | SubmitIntents(eff.address)
        outputs.output | collected.sink()
    assert sorted(collected.values()) == [b"timed out long", b"timed out short"]
    started = {key: at for trigger, key, at in _COMMITS if trigger == "event"}
    fired = {key: at for trigger, key, at in _COMMITS if trigger == "deadline"}
    for key, wait_s in ((b"short", 1.5), (b"long", 3.0)):
        waited = fired[key] - started[key]
        assert wait_s <= waited < wait_s + 2.0, (key, waited)


# -- a plain TestStream test --------------------------------------------------------------


async def _suspends_for_a_minute(ctx: ActivationContext) -> Complete | Suspend:
    return Suspend(snapshot=b"-", timeout_ms=60_000) if not ctx.is_resume else Complete()


def _plain_test_stream_outputs(advance_ms: int) -> list[bytes]:
    """A default-runner TestStream pipeline with no clock configured; the outputs it made."""
    stream = EnvelopeStream().event(b"k", b"go", at_ms=1_000).advance_processing_time(advance_ms)
    policy = HitlPolicy(
        timeout_ms=60_000, intent_ttl_ms=60_000, approval_channel="desk", on_timeout=_deny
    )
    options = beam.options.pipeline_options.PipelineOptions(streaming=True)
    collected = Collector.new()
    with beam.Pipeline(options=options) as pipeline:
        outputs = (
            pipeline
            | stream.build()
            | RunAgent(_suspends_for_a_minute, config=AgentConfig(hitl_policy=policy))
        )
        outputs.output | collected.sink()
    return collected.values()


def test_a_plain_test_stream_fires_a_deadline_once_processing_time_passes_it() -> None:
    assert _plain_test_stream_outputs(advance_ms=61_000) == [b"timed out k"]


def test_a_plain_test_stream_does_not_fire_a_deadline_before_processing_time_reaches_it() -> None:
    assert _plain_test_stream_outputs(advance_ms=59_000) == []


# -- shapes a local runner cannot run ------------------------------------------------------


def test_read_envelopes_on_the_bundle_based_runner_fails_at_construction() -> None:
    pipeline = beam.Pipeline(runner=BundleBasedDirectRunner())
    with pytest.raises(ValueError, match=r"use beam\.Pipeline\(\) or .*FnApiRunner"):
        pipeline | ReadEnvelopes("127.0.0.1:9", events=[])


def test_read_envelopes_with_a_test_stream_fails_before_anything_is_published(
    tmp_path: Path,
) -> None:
    event = AgentEnvelope(entity_key=b"k", event_time_ms=1, external_event=b"{}")
    with EffectorThread(f"sqlite:///{tmp_path}/effector.db", ToolRegistry()) as eff:
        pipeline = beam.Pipeline()
        read = pipeline | "Read" >> ReadEnvelopes(eff.address, events=[event])
        streamed = pipeline | "Stream" >> EnvelopeStream().event(b"k", b"{}", at_ms=1).build()
        (read, streamed) | beam.Flatten() | RunAgent(_suspends_for_a_minute)
        with pytest.raises(ValueError, match="ReadEnvelopes and TestStream cannot share"):
            pipeline.run()
        assert eff.run(eff.server.store.counts()).head_offset == 0  # nothing was published


def test_one_readme_loop_run_passes_through_at_most_25_project_files(tmp_path: Path) -> None:
    """A reader follows one event through a dozen files: every thread's calls are counted."""
    local_loop = _example()
    packages = (str(REPO / "beam_agents"), str(REPO / "effector"))
    seen: set[str] = set()

    def profile(frame: Any, event: str, arg: Any) -> None:
        path = frame.f_code.co_filename
        if event == "call" and path.startswith(packages) and "_pb2" not in path:
            seen.add(str(Path(path).relative_to(REPO)))

    sys.setprofile(profile)
    threading.setprofile(profile)
    try:
        with EffectorThread(
            f"sqlite:///{tmp_path}/effector.db", local_loop.make_registry()
        ) as effector:
            local_loop.run(effector.address, str(tmp_path))
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    assert local_loop.read_lines(str(tmp_path))[0] == "denied o-0"
    assert {"beam_agents/io/run_agent.py", "effector/worker.py"} <= seen
    assert len(seen) <= 25, sorted(seen)
