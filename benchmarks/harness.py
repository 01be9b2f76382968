"""What the benchmarks share: statistics, timing, instruction counts, server subprocesses and
the effector's tools.

It imports no Beam: the effector subprocesses load their tools from here
(``--tools benchmarks.harness:make_registry``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from beam_agents.tools import ToolRegistry, tool
from benchmarks.report import REPO_ROOT, Result, load_average, machine_info, render_markdown, table
from effector.launch import READY_PREFIX, EffectorProcess, child_environment

EFFECTOR_READY = READY_PREFIX


@tool(side_effect=True)
async def noop() -> None:
    """Do nothing."""


@tool(side_effect=True)
async def stamp() -> dict[str, int]:
    """Return the system-wide monotonic clock (ns) at entry and at exit."""
    started_ns = time.monotonic_ns()
    return {"started_ns": started_ns, "ended_ns": time.monotonic_ns()}


def make_registry() -> ToolRegistry:
    """A fresh registry of the benchmark tools."""
    return ToolRegistry([noop, stamp])


def percentile(samples: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile (``fraction`` in [0, 1]) of ``samples``."""
    if not samples:
        raise ValueError("no samples")
    ordered = sorted(samples)
    rank = math.ceil(round(fraction * len(ordered), 9))  # rounded: 0.57 * 100 is 56.99...
    return ordered[max(1, min(len(ordered), rank)) - 1]


def seconds_per_call(action: Callable[[], object]) -> float:
    """Wall time of one call of ``action``, in seconds."""
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def environment() -> dict[str, str]:
    """The environment for subprocesses: this one, with the repository importable."""
    return child_environment(REPO_ROOT)


def effector_command(
    store_url: str, *, concurrency: int | None = None, policy: Path | None = None
) -> list[str]:
    """``python -m effector serve`` with the benchmark tools on ``store_url``, any free port.

    Without ``concurrency`` it runs with the default a user gets; with ``policy``, it enforces
    that effect policy file.
    """
    tuning = [] if concurrency is None else ["--concurrency", str(concurrency)]
    tuning += [] if policy is None else ["--policy", str(policy)]
    return [
        sys.executable,
        "-m",
        "effector",
        "serve",
        "--tools",
        "benchmarks.harness:make_registry",
        "--store",
        store_url,
        "--listen",
        "127.0.0.1:0",
        *tuning,
        "--log-level",
        "WARNING",
    ]


@contextlib.contextmanager
def servers(commands: Sequence[list[str]], ready: str, logs: Path) -> Iterator[list[str]]:
    """Start one server per command, each logging to a file in ``logs``; yield their addresses.

    On exit each gets SIGTERM (so it drains), then SIGKILL if it has not exited within 30 s.
    """
    with contextlib.ExitStack() as stack:
        addresses = []
        for index, command in enumerate(commands):
            log = stack.enter_context((logs / f"{ready.split()[0]}-{index}.log").open("w"))
            process = EffectorProcess(
                command=command, env=environment(), cwd=REPO_ROOT, log=log, ready_prefix=ready
            )
            addresses.append(stack.enter_context(process).address)
        yield addresses


@contextlib.contextmanager
def sqlite_effector() -> Iterator[str]:
    """An effector subprocess on a fresh SQLite store (``synchronous=FULL``); yields its target."""
    with tempfile.TemporaryDirectory(prefix="beam-agents-bench-") as scratch:
        command = effector_command(f"sqlite:///{Path(scratch) / 'e.db'}")
        with servers([command], EFFECTOR_READY, Path(scratch)) as (target,):
            yield target


# -- instruction counts ---------------------------------------------------------------------------

_INSTRUCTIONS = re.compile(r"^==\d+== I\s+refs:\s+([\d,]+)$", re.MULTILINE)


def instruction_total(report: str) -> int:
    """The instruction count in valgrind's summary on stderr (its ``I   refs:`` line)."""
    match = _INSTRUCTIONS.search(report)
    if match is None:
        raise ValueError("no `I refs:` line in valgrind's report")
    return int(match[1].replace(",", ""))


def instructions(valgrind: str, command: Sequence[str]) -> int:
    """The instructions cachegrind counts running ``command`` with ``PYTHONHASHSEED=0``."""
    counting = [valgrind, "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null"]
    completed = subprocess.run(
        [*counting, *command],
        env={**environment(), "PYTHONHASHSEED": "0"},
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return instruction_total(completed.stderr)


def instructions_per_element(
    command: Callable[[str, int], Sequence[str]], names: Iterable[str], count: int, extra: int
) -> dict[str, float] | None:
    """Per name, ``(Ir(count + extra) - Ir(count)) / extra`` of ``command(name, elements)``
    under cachegrind, the runs sharing the cores; ``None`` when valgrind is not on ``PATH``."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        return None
    names = list(names)
    runs = [(name, size) for name in names for size in (count, count + extra)]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        counted = pool.map(lambda run: instructions(valgrind, command(*run)), runs)
        totals = dict(zip(runs, counted, strict=True))
    return {name: (totals[name, count + extra] - totals[name, count]) / extra for name in names}


# -- the suite ------------------------------------------------------------------------------------

BENCHMARKS = {
    "noop_activation": "benchmarks.pipelines",
    "budget_overhead": "benchmarks.pipelines",
    "overhead_tiers": "benchmarks.pipelines",
    "run_inference": "benchmarks.pipelines",
    "state_commit": "benchmarks.pipelines",
    "suspend_resume": "benchmarks.loop",
    "effector_throughput": "benchmarks.effectors",
    "policy_overhead": "benchmarks.effectors",
    "write_traces": "benchmarks.loop",
    "console_keys": "benchmarks.effectors",
    "replay_backtest": "benchmarks.pipelines",
    "adapter_overhead": "benchmarks.adapters",
    "end_to_end": "benchmarks.loop",
}
"""Each benchmark, in report order, and the module holding its function of the same name."""

COMPILED_TREE = "BENCHMARKS_COMPILED_TREE"
"""Names a copy of the repository whose core is compiled (``make compiled``), measured too."""

TIMEOUT_S = {False: 900.0, True: 120.0}
"""The longest one benchmark may take, full and quick."""


def run_one(name: str, *, quick: bool) -> Result:
    """Run benchmark ``name`` in this process."""
    measure: Callable[[bool], Result] = getattr(importlib.import_module(BENCHMARKS[name]), name)
    started = time.perf_counter()
    result = measure(quick)
    result.elapsed_s = time.perf_counter() - started
    return result


def run_in_subprocess(name: str, *, quick: bool) -> Result:
    """Run benchmark ``name`` in a fresh interpreter; raise ``RuntimeError`` if it fails."""
    with tempfile.TemporaryDirectory(prefix="beam-agents-bench-") as scratch:
        output = Path(scratch) / f"{name}.json"
        command = [sys.executable, "-m", "benchmarks", "--run-one", name, "--json", str(output)]
        # A session of its own, so that a hung benchmark is stopped with every server it started.
        process = subprocess.Popen(
            [*command, *(["--quick"] if quick else [])],
            env=environment(),
            cwd=REPO_ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            _, stderr = process.communicate(timeout=TIMEOUT_S[quick])
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise RuntimeError(f"did not finish within {TIMEOUT_S[quick]:.0f} s") from None
        if process.returncode != 0 or not output.exists():
            lines = stderr.replace(f"{REPO_ROOT}/", "").strip().splitlines()
            raise RuntimeError(f"exited with {process.returncode}: {lines[-1] if lines else ''}")
        return Result.from_json(output.read_text())


def main(argv: Sequence[str] | None = None) -> int:
    """Run the suite and write the report (or, with ``--run-one``, one benchmark here)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description="Run the suite.")
    parser.add_argument("--quick", action="store_true", help="one tiny iteration of each")
    parser.add_argument("--only", metavar="NAME[,NAME...]", help=f"of: {', '.join(BENCHMARKS)}")
    parser.add_argument(
        "--output", type=Path, help="the report (default: BENCHMARKS.md for a full run of all)"
    )
    parser.add_argument(
        "--compiled",
        type=Path,
        metavar="DIR",
        help="a copy with the core compiled (`make compiled`): activations are measured there too",
    )
    parser.add_argument("--run-one", metavar="NAME", help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    names = options.only.split(",") if options.only else list(BENCHMARKS)
    unknown = sorted({*names, *([options.run_one] if options.run_one else [])} - set(BENCHMARKS))
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(unknown)}")
    if options.run_one:
        result = run_one(options.run_one, quick=options.quick)
        if options.json is not None:
            options.json.write_text(result.to_json())
        print("\n".join(table([result])))
        return 0
    if options.compiled is not None:
        os.environ[COMPILED_TREE] = str(options.compiled.resolve())  # the activations read it
    machine = machine_info()
    results, failures = [], {}
    for name in names:
        print(f"running {name} ...", flush=True)
        try:
            result = run_in_subprocess(name, quick=options.quick)
        except RuntimeError as failure:
            failures[name] = str(failure)
            print(f"{name} failed: {failure}", file=sys.stderr, flush=True)
            continue
        results.append(result)
        print("\n".join(table([result])), flush=True)
    machine["Load average at end"] = load_average()
    mode = "quick smoke run (`--quick`), tiny sizes: not a full run" if options.quick else "full"
    output = options.output
    if output is None and not options.quick and not options.only:
        output = REPO_ROOT / "BENCHMARKS.md"
    if output is not None:
        output.write_text(render_markdown(results, machine, failures, mode))
        print(f"wrote {output}")
    return 1 if failures else 0
