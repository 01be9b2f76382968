"""Regenerate the Python code for the protos under this folder into ``beam_agents/_protos``.

Run by ``make proto`` and by the drift test, which generates into a temporary folder and
compares the result with the committed files. Kept as a script (not a package module) so it
works even when the committed generated code is missing or broken.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grpc_tools import protoc  # type: ignore[import-untyped]

PROTO_ROOT = Path(__file__).resolve().parent
REPO_ROOT = PROTO_ROOT.parent
PROTO_FILES = sorted(
    str(path.relative_to(PROTO_ROOT)) for path in (PROTO_ROOT / "beam_agents").rglob("*.proto")
)


def generate(out_dir: Path) -> None:
    """Write ``*_pb2.py``, ``*_pb2.pyi`` and ``*_pb2_grpc.py`` for every proto into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    well_known = Path(protoc.__file__).resolve().parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"--proto_path={PROTO_ROOT}",
        f"--proto_path={well_known}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *PROTO_FILES,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed; see the messages above")


def main() -> None:
    """Command-line entry point: ``python protos/generate.py [--out DIR]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT, help="root to write into")
    generate(parser.parse_args().out)


if __name__ == "__main__":
    sys.exit(main())
