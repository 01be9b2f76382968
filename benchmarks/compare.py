"""Compare this checkout's benchmark ratios with another revision's, in interleaved rounds.

``python -m benchmarks.compare --base REV --only noop_activation --rounds 5`` checks ``REV`` out
into a temporary git worktree with a virtualenv of its own, runs the chosen benchmarks in turns
(head, base, head, base, ...) and prints, per figure both sides report, the median of each
side's ratios to its floor, the base's range over its rounds and the change of the medians.
Nothing is written to ``BENCHMARKS.md``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.report import REPO_ROOT, ratios


def prepare_base(revision: str, scratch: Path) -> Path:
    """A worktree of ``revision`` with its own virtualenv holding that revision's package."""
    tree = scratch / "base"
    subprocess.run(
        ["git", "-C", str(REPO_ROOT), "worktree", "add", "--detach", str(tree), revision],
        check=True,
        capture_output=True,
    )
    subprocess.run([sys.executable, "-m", "venv", str(tree / ".venv")], check=True)
    subprocess.run(
        [str(tree / ".venv/bin/python"), "-m", "pip", "install", "--quiet", "-e", f"{tree}[dev]"],
        check=True,
    )
    return tree


def suite_command(tree: Path, python: Path, only: str, output: Path) -> list[str]:
    """The suite's command line in ``tree``; a suite from before issue 41 also takes
    ``--no-profile``, which keeps it from profiling its misses."""
    command = [str(python), "-m", "benchmarks", "--only", only, "--output", str(output)]
    if (tree / "benchmarks" / "run_all.py").exists():
        command.append("--no-profile")
    return command


def run_round(tree: Path, python: Path, only: str, output: Path) -> dict[str, float]:
    """One run of the chosen benchmarks in ``tree``; its ratios by figure."""
    command = suite_command(tree, python, only, output)
    subprocess.run(command, cwd=tree, check=True, capture_output=True)
    return ratios(output.read_text())


def main() -> int:
    """Run the comparison and print one line per figure."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the revision to compare against")
    parser.add_argument("--only", required=True, help="benchmarks, comma-separated")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per side (default 5)")
    args = parser.parse_args()
    seen: dict[str, dict[str, list[float]]] = {"head": {}, "base": {}}
    with tempfile.TemporaryDirectory(prefix="bench-compare-") as scratch_dir:
        scratch = Path(scratch_dir)
        base = prepare_base(args.base, scratch)
        sides = {
            "head": (REPO_ROOT, Path(sys.executable)),
            "base": (base, base / ".venv/bin/python"),
        }
        try:
            for turn in range(args.rounds):
                for side, (tree, python) in sides.items():
                    output = scratch / f"{side}-{turn}.md"
                    for figure, ratio in run_round(tree, python, args.only, output).items():
                        seen[side].setdefault(figure, []).append(ratio)
                print(f"round {turn + 1} of {args.rounds} done", file=sys.stderr)
        finally:
            subprocess.run(
                ["git", "-C", str(REPO_ROOT), "worktree", "remove", "--force", str(base)],
                check=False,
                capture_output=True,
            )
    print(f"{'figure':64} {'base':>6} {'base range':>13} {'head':>6} {'change':>7}")
    for figure, head_ratios in seen["head"].items():
        base_ratios = seen["base"].get(figure)
        new = statistics.median(head_ratios)
        if base_ratios:
            old = statistics.median(base_ratios)
            spread = f"{min(base_ratios):.2f}-{max(base_ratios):.2f}"
            change = (new / old - 1) * 100
            print(f"{figure[:64]:64} {old:6.2f} {spread:>13} {new:6.2f} {change:+6.1f}%")
        else:
            print(f"{figure[:64]:64} {'-':>6} {'-':>13} {new:6.2f} {'-':>7}")
    for figure, base_ratios in seen["base"].items():
        if figure not in seen["head"]:
            old = statistics.median(base_ratios)
            spread = f"{min(base_ratios):.2f}-{max(base_ratios):.2f}"
            print(f"{figure[:64]:64} {old:6.2f} {spread:>13} {'-':>6} {'-':>7}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
