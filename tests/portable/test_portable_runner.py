# mypy: disallow-untyped-calls=False
# (Beam's own API is mostly unannotated.)
"""RunAgent through Beam's PortableRunner, with the SDK worker in a process of its own.

Starts Beam's local Python job service and an external worker pool (both from the installed
``apache_beam``, as subprocesses reached on 127.0.0.1; the worker pool's command line has no
bind address, so it listens on every interface), runs an agent pipeline with
``--environment_type=EXTERNAL`` and checks what the worker wrote: per-key order, memory carried
from one event to the next, the model path, and intents whose ids ``intent_id_for`` predicts.
This is the path Flink and Spark take (a job service plus SDK workers), minus the JVM.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from beam_agents import AgentConfig, RunAgent, intent_id_for
from beam_agents._protos import AgentEnvelope, AgentError, ToolIntent
from effector.launch import child_environment, free_port
from tests.portable.agents import (
    FIRST_REPLY,
    LATER_REPLY,
    SHIP_PREFIX,
    WriteEach,
    make_provider,
    make_registry,
    note_taker,
    read_reports,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
LOOPBACK = "127.0.0.1"
START_TIMEOUT_S = 30.0

EVENTS: dict[bytes, list[str]] = {
    b"alice": ["hello", "ship:book", "thanks", "ship:pen"],
    b"bob": ["ship:lamp", "ship:desk"],
    b"carol": ["just looking"],
}


@dataclass(frozen=True)
class BeamServices:
    """Where the job service and the worker pool listen."""

    job_endpoint: str
    worker_pool: str


def _log_tail(path: Path, limit: int = 4_000) -> str:
    return path.read_text(errors="replace")[-limit:] if path.exists() else ""


def _start(module: str, args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """``python -m module args``, its servers on loopback, in a session of its own.

    It runs in the log's directory, so only ``PYTHONPATH`` makes the repository importable.
    """
    with log.open("wb") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.portable.loopback", module, *args],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=log.parent,
            start_new_session=True,
        )


def _wait_listening(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"{log.stem} exited with {process.returncode}:\n{_log_tail(log)}")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.settimeout(0.5)
            if probe.connect_ex((LOOPBACK, port)) == 0:
                return
        time.sleep(0.1)
    pytest.fail(f"{log.stem} did not listen on {port} in {START_TIMEOUT_S} s:\n{_log_tail(log)}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group, then SIGKILL whatever is left of it.

    The worker pool's SDK worker processes are in its group and outlive it on SIGTERM.
    """
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


@pytest.fixture
def beam_services(tmp_path: Path) -> Iterator[BeamServices]:
    """Beam's job service and worker pool, with this repository importable by the workers.

    The worker pool starts each SDK worker as ``python -c ...``, so this interpreter's
    directory goes first on ``PATH``.
    """
    env = child_environment(
        REPO_ROOT,
        PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    )
    job_port, pool_port = free_port(), free_port()
    while pool_port == job_port:
        pool_port = free_port()
    processes: list[subprocess.Popen[bytes]] = []
    try:
        job_log, pool_log = tmp_path / "job_service.log", tmp_path / "worker_pool.log"
        processes.append(
            _start(
                "apache_beam.runners.worker.worker_pool_main",
                [f"--service_port={pool_port}"],
                pool_log,
                env,
            )
        )
        processes.append(
            _start(
                "apache_beam.runners.portability.local_job_service_main",
                ["--port", str(job_port)],
                job_log,
                env,
            )
        )
        _wait_listening(pool_port, processes[0], pool_log)
        _wait_listening(job_port, processes[1], job_log)
        yield BeamServices(f"{LOOPBACK}:{job_port}", f"{LOOPBACK}:{pool_port}")
    finally:
        for process in reversed(processes):
            _stop(process)


def _elements() -> list[tuple[bytes, AgentEnvelope]]:
    return [
        (
            key,
            AgentEnvelope(
                entity_key=key, event_time_ms=1_000 * (index + 1), external_event=e.encode()
            ),
        )
        for key, events in EVENTS.items()
        for index, e in enumerate(events)
    ]


def _read(directory: Path, tag: str) -> list[bytes]:
    return [path.read_bytes() for path in sorted(directory.glob(f"{tag}-*"))]


@pytest.mark.timeout(120)
def test_run_agent_on_the_portable_runner_with_an_external_worker(
    beam_services: BeamServices, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    options = PipelineOptions(
        [
            "--runner=PortableRunner",
            f"--job_endpoint={beam_services.job_endpoint}",
            "--environment_type=EXTERNAL",
            f"--environment_config={beam_services.worker_pool}",
        ]
    )
    config = AgentConfig(provider_factory=make_provider, tool_registry=make_registry())
    with beam.Pipeline(options=options) as pipeline:
        events = pipeline | "Events" >> beam.Create(_elements()).with_output_types(
            tuple[bytes, AgentEnvelope]
        )
        outputs = events | "Agent" >> RunAgent(note_taker, config=config)
        for tag in ("output", "intents", "errors"):
            getattr(outputs, tag) | f"Write_{tag}" >> beam.ParDo(WriteEach(str(out), tag))

    errors = [AgentError.FromString(data) for data in _read(out, "errors")]
    assert errors == []

    reports = read_reports(out)
    assert {report["pid"] for report in reports}.isdisjoint({os.getpid()})
    by_key: dict[str, list[dict[str, object]]] = defaultdict(list)
    for report in reports:
        by_key[str(report["key"])].append(report)
    assert sorted(by_key) == sorted(key.decode() for key in EVENTS)
    expected_intents: dict[str, tuple[bytes, str]] = {}
    for key, events in EVENTS.items():
        runs = sorted(by_key[key.decode()], key=lambda report: int(str(report["seq"])))
        # One run per event, numbered 0, 1, ... in the order the key processed them.
        assert [run["seq"] for run in runs] == list(range(len(events)))
        assert sorted(str(run["event"]) for run in runs) == sorted(events)
        for position, run in enumerate(runs):
            # Each run saw exactly the events of the runs before it on its key: memory carried.
            assert run["seen"] == [earlier["event"] for earlier in runs[:position]]
            assert run["reply"] == (FIRST_REPLY if position == 0 else LATER_REPLY).decode()
            event = str(run["event"])
            if event.startswith(SHIP_PREFIX):
                # The model call took step 0, so the intent is the run's step 1.
                predicted = intent_id_for(key, position, 1)
                assert run["intent_id"] == predicted
                expected_intents[predicted] = (key, event.removeprefix(SHIP_PREFIX))
            else:
                assert run["intent_id"] == ""

    intents = [ToolIntent.FromString(data) for data in _read(out, "intents")]
    assert len(expected_intents) == 4
    assert {intent.intent_id: intent for intent in intents}.keys() == expected_intents.keys()
    assert len(intents) == len(expected_intents)
    for intent in intents:
        key, parcel = expected_intents[intent.intent_id]
        assert intent.entity_key == key
        assert intent.kind == ToolIntent.TOOL
        assert intent.tool_name == "ship_parcel"
        assert json.loads(intent.args_json) == {"parcel": parcel}
        assert intent.step_index == 1
