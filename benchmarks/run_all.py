"""The suite's entry point: run every benchmark and write ``BENCHMARKS.md``.

``python -m benchmarks`` (what ``make bench`` runs) runs each benchmark in its own subprocess
(so one cannot disturb another's memory, caches or threads, and a crash or hang is reported
instead of ending the suite), profiles the ones that miss a target, and writes the report.
``--quick`` runs one tiny iteration of each and writes nothing unless ``--output`` is given;
``--only`` picks benchmarks by name.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks.harness import REPO_ROOT, child_environment
from benchmarks.report import (
    BenchmarkResult,
    figure_row,
    load_average,
    machine_info,
    render_markdown,
)

BENCHMARKS = (
    "noop_activation",
    "overhead_tiers",
    "run_inference",
    "state_commit",
    "suspend_resume",
    "effector_throughput",
    "write_traces",
    "console_keys",
    "replay_backtest",
    "adapter_overhead",
    "scale_out",
    "end_to_end",
)
"""Module names under ``benchmarks``, in report order."""

TIMEOUT_S = {False: 300.0, True: 120.0}
"""The longest one benchmark may take, full and quick."""


def run_one(name: str, *, quick: bool, profile: bool) -> BenchmarkResult:
    """Run benchmark ``name`` in this process; profile it too if it missed a target."""
    module = importlib.import_module(f"benchmarks.{name}")
    started = time.perf_counter()
    result: BenchmarkResult = module.run(quick)
    missed = any(figure.met is False for figure in result.figures)
    if profile and missed and hasattr(module, "profile"):
        result.findings, result.profile = module.profile(quick)
    result.elapsed_s = time.perf_counter() - started
    return result


def run_in_subprocess(name: str, *, quick: bool, profile: bool) -> BenchmarkResult:
    """Run benchmark ``name`` in a fresh interpreter; raise ``RuntimeError`` if it fails."""
    with tempfile.TemporaryDirectory(prefix="beam-agents-bench-") as scratch:
        output = Path(scratch) / f"{name}.json"
        command = [sys.executable, "-m", "benchmarks", "--run-one", name, "--json", str(output)]
        if quick:
            command.append("--quick")
        if not profile:
            command.append("--no-profile")
        # A session of its own, so that a hung benchmark is stopped with every server it
        # started (effectors, PostgreSQL helpers, pipeline processes).
        process = subprocess.Popen(
            command,
            env=child_environment(),
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
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
            # The report is committed: name the error, not this machine's paths.
            lines = stderr.replace(f"{REPO_ROOT}/", "").strip().splitlines()
            raise RuntimeError(
                f"exited with status {process.returncode}: {lines[-1] if lines else ''}"
            )
        return BenchmarkResult.from_json(output.read_text())


def _print_result(number: int, result: BenchmarkResult) -> None:
    print(f"{number}. {result.title} ({result.elapsed_s:.0f} s)", flush=True)
    for figure in result.figures:
        print(f"  {figure_row(number, figure)}")
    for detail in result.details:
        print(f"  - {detail}")
    for line in [*result.findings, *result.profile]:
        print(f"  {line}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description="Run the performance suite."
    )
    parser.add_argument("--quick", action="store_true", help="one tiny iteration of each")
    parser.add_argument(
        "--only",
        metavar="NAME[,NAME...]",
        help=f"run only these benchmarks (of: {', '.join(BENCHMARKS)})",
    )
    parser.add_argument(
        "--output",
        type=Path,
        help="where to write the report (default: BENCHMARKS.md at the repository root for a "
        "full run; nowhere for --quick)",
    )
    parser.add_argument(
        "--no-profile", action="store_true", help="do not profile benchmarks that miss a target"
    )
    parser.add_argument("--run-one", metavar="NAME", help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the suite (or, with ``--run-one``, one benchmark in this process)."""
    parser = _parser()
    options = parser.parse_args(argv)
    profile = not options.no_profile
    if options.run_one:
        if options.run_one not in BENCHMARKS:
            parser.error(f"unknown benchmark {options.run_one!r}")
        result = run_one(options.run_one, quick=options.quick, profile=profile)
        if options.json is not None:
            options.json.write_text(result.to_json())
        _print_result(BENCHMARKS.index(options.run_one) + 1, result)
        return 0
    names = BENCHMARKS if not options.only else tuple(options.only.split(","))
    unknown = sorted(set(names) - set(BENCHMARKS))
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(unknown)}")
    machine = machine_info()
    started = time.perf_counter()
    results: list[BenchmarkResult] = []
    failures: dict[str, str] = {}
    for name in names:
        print(f"running {name} ...", flush=True)
        try:
            result = run_in_subprocess(name, quick=options.quick, profile=profile)
        except RuntimeError as failure:
            failures[name] = str(failure)
            print(f"{name} failed: {failure}", file=sys.stderr, flush=True)
            continue
        results.append(result)
        _print_result(BENCHMARKS.index(name) + 1, result)
    machine["Load average at end (1, 5, 15 min)"] = load_average()
    report = render_markdown(
        results,
        machine,
        order=BENCHMARKS,
        quick=options.quick,
        failures=failures,
        elapsed_s=time.perf_counter() - started,
    )
    output = options.output
    if output is None and not options.quick:
        output = REPO_ROOT / "BENCHMARKS.md"
    if output is not None:
        output.write_text(report)
        print(f"wrote {output}")
    return 1 if failures else 0
